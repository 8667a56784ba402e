"""Runtime specs (``cronkeeper.schedules``): a mapping with exactly the keys of a schedule table
in a file, validated by the very rules and messages of ``cronkeeper validate``
(:func:`cronkeeper.schedule.validate.check_schedule`), plus what only a runtime spec must not
do: name a ``command`` (argv comes only from the schedule files on the workers, SPEC §7). A
``calendar`` names one the schedule files define, as the leader recorded it in the database.

:func:`check_specs` returns each valid spec with the texts a put stores, or raises
:class:`ScheduleError` listing every problem of every spec at once (``.problems``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from cronkeeper.errors import ScheduleError
from cronkeeper.schedule import calendars as cal
from cronkeeper.schedule import values as v
from cronkeeper.schedule.diagnostics import Diagnostic
from cronkeeper.schedule.model import ScheduleSpec
from cronkeeper.schedule.validate import Memo, check_schedule
from cronkeeper.timing.calendars import Calendar

RUNTIME = "<runtime>"  # the "file" of a runtime spec's diagnostics
COMMAND_REFUSED = ("'command' is not accepted at runtime: argv comes only from the schedule "
                   "files on the workers; define this schedule in a file, or give a 'task'")


class Checked:
    """A valid runtime spec: the spec, the mapping as given (JSON), and the spec as a version
    stores it (canonical JSON) with its digest."""

    __slots__ = ("canonical", "digest", "given", "spec")

    def __init__(self, spec: ScheduleSpec, given: str) -> None:
        self.spec = spec
        self.given = given
        self.canonical, self.digest = spec.canonical_and_digest()


def check_specs(
    specs: Mapping[Any, Any], *, now: datetime, file: str = RUNTIME,
    line_of: Callable[..., Callable[..., int]] | None = None,
    calendars: Mapping[str, tuple[Calendar, str | None]] | None = None,
) -> list[Checked]:
    """Validate every spec of ``specs`` ({name: mapping}); raise ScheduleError with every
    problem of every spec (warnings are not problems). ``line_of(name)``: the line function of
    a spec read from a file (``cronkeeper schedules put --from FILE``); none: line 0.
    ``calendars``: {name: (calendar, its file)} a spec's ``calendar`` may name (those the
    leader recorded from the files), resolved as the loader resolves a file's."""
    memo = Memo()
    problems: list[Diagnostic] = []
    checked: list[Checked] = []

    def nowhere(*_path: str) -> int:
        return 0

    for name, table in specs.items():
        lines = line_of(name) if line_of is not None else nowhere
        if not isinstance(name, str):
            problems.append(Diagnostic(file, 0, str(name), f"a schedule's name must be a "
                                       f"string, not {v.type_name(name)}"))
            continue
        if not isinstance(table, Mapping):
            problems.append(Diagnostic(file, lines(), name, (
                "a spec must be a mapping with the keys of a schedule table (cron, timezone, "
                f"misfire, task ...), not {v.type_name(table)}")))
            continue
        table = dict(table)
        before = len(problems)
        if "command" in table:
            problems.append(Diagnostic(file, lines("command"), name, COMMAND_REFUSED))
        spec, diags = check_schedule(name, table, file=file, line_of=lines, now=now, memo=memo,
                                     warnings_needed=False)
        problems.extend(diags)
        try:
            given = json.dumps(table, allow_nan=False, separators=(",", ":"), sort_keys=True)
        except (TypeError, ValueError) as exc:
            if not diags:  # (the checks above name the key where they can)
                problems.append(Diagnostic(file, lines(), name, f"not strict JSON: {exc}"))
            continue
        if spec is not None and "calendar" in table:
            spec = _with_calendar(spec, table["calendar"], calendars or {}, file,
                                  lines("calendar"), problems)
        if spec is not None and len(problems) == before:
            checked.append(Checked(spec, given))
    if problems:
        raise schedule_error(problems)
    return checked


def _with_calendar(spec: ScheduleSpec, name: str,
                   calendars: Mapping[str, tuple[Calendar, str | None]], file: str, line: int,
                   problems: list[Diagnostic]) -> ScheduleSpec | None:
    """``spec`` with the dates of the calendar it names, resolved by the loader's rules and
    messages (``schedule.calendars.resolve``); None, with the problem, when it cannot be."""
    defs = [cal.CalendarDef(n, origin or "the schedule files", 0, calendar)
            for n, (calendar, origin) in calendars.items()]
    resolved, _, diags = cal.resolve(defs, [cal.CalendarRef(spec.name, name, file, line)])
    problems.extend(diags)
    found = resolved.get(spec.name)
    return spec.with_calendar(found) if found is not None else None


def schedule_error(problems: list[Diagnostic]) -> ScheduleError:
    """ScheduleError listing ``problems`` (``schedule 'name': message`` a line each)."""
    count = len(problems)
    lines = "\n".join(
        d.render() if d.file != RUNTIME else f"schedule '{d.schedule}': {d.message}"
        for d in problems)
    return ScheduleError(f"{count} problem{'s' if count != 1 else ''} in runtime schedule "
                         f"specs:\n{lines}", problems)
