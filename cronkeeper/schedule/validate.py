"""One schedule table -> a frozen :class:`ScheduleSpec`, or every problem with it, each with its
file and line.

The rules themselves (docs/schedules.md is the reference) are :mod:`cronkeeper.schedule.rules`;
here they are applied: valid tables are remembered per load (:class:`Memo`), and a value nested
too deeply to check is reported at its key.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from sys import intern  # repeated values kept once (see model.shared_text)
from typing import Any

from cronkeeper.schedule import timing_checks as timing
from cronkeeper.schedule import values as v
from cronkeeper.schedule.diagnostics import Diagnostic, Severity
from cronkeeper.schedule.model import ScheduleSpec
from cronkeeper.schedule.rules import Finding, check_table


class Memo:
    """What :func:`check_schedule` remembers of valid tables, for one ``now`` (a load): by the
    table's text without ``task`` and ``description`` (and its cron's ``H`` resolved for the
    name: ``H 6 * * *`` findings depend on the minute it gives), its spec (those two and the name to
    replace) and its findings (warnings). A script that generates schedules mostly varies only
    those; where it varies more (each table its own cron and payload), looking costs more than
    it saves, so after :attr:`TRIAL` tables with too few hits the memo stops looking."""

    TRIAL = 1000
    LIMIT = 1 << 14

    __slots__ = ("hits", "tables", "tries")

    def __init__(self) -> None:
        self.tables: dict[tuple[str, bool, bool, str | bool | None],
                          tuple[ScheduleSpec | None, tuple[Finding, ...]]]
        self.tables = {}
        self.tries = 0
        self.hits = 0

    @property
    def worth_it(self) -> bool:
        return self.tries < self.TRIAL or self.hits * 4 >= self.tries


def check_schedule(
    name: str,
    table: dict[str, Any],
    *,
    file: str,
    line_of: Callable[..., int],
    now: datetime,
    memo: Memo | None = None,
    spec_needed: bool = True,
    warnings_needed: bool = True,
) -> tuple[ScheduleSpec | None, list[Diagnostic]]:
    """Validate one schedule (see :func:`_check_schedule`). A value nested too deeply for the
    checks' recursion (a header of 2,000 dotted keys: tomllib reads it) is reported at its key,
    and the rest of the table is checked without it: a clear error, never a RecursionError.
    The walk that finds it runs only then, so valid tables cost nothing more."""
    try:
        return _check_schedule(name, table, file=file, line_of=line_of, now=now, memo=memo,
                               spec_needed=spec_needed, warnings_needed=warnings_needed)
    except RecursionError:
        pass
    deep = {key: problem for key, value in table.items()
            if (problem := v.depth_problem(key, value)) is not None}
    diags = [Diagnostic(file, line_of(key), name, problem) for key, problem in deep.items()]
    if not diags:  # pragma: no cover - a RecursionError comes from a deep value
        return None, [Diagnostic(file, line_of(), name, "nested too deeply to check")]
    rest = {key: value for key, value in table.items() if key not in deep}
    _, others = check_schedule(name, rest, file=file, line_of=line_of, now=now, memo=memo,
                               spec_needed=False, warnings_needed=warnings_needed)
    return None, diags + others


def _check_schedule(
    name: str,
    table: dict[str, Any],
    *,
    file: str,
    line_of: Callable[..., int],
    now: datetime,
    memo: Memo | None,
    spec_needed: bool,
    warnings_needed: bool,
) -> tuple[ScheduleSpec | None, list[Diagnostic]]:
    """Validate one schedule. ``line_of(*key_path)`` gives the line of a key of this table.

    ``memo`` (one per ``now``; the loader keeps one per load) remembers valid tables (see
    :class:`Memo`); name, task and description are checked per schedule here, so a table seen
    before costs those checks and a dict look-up. A table with any error is checked afresh each
    time. ``spec_needed=False``: only the diagnostics are wanted (``validate``); no spec is made
    and None is returned in its place. ``warnings_needed=False``: only errors are returned.
    """
    if memo is None or not memo.worth_it:
        spec, findings = check_table(name, table, now, file, line_of, spec_needed)[1:]
    else:
        task = table.get("task")
        description = table.get("description")
        hashed = timing.hashed_cron(name, table.get("cron"))
        if (
            v.name_problem(name) is not None
            or (task is not None and v.task_problem(task) is not None)
            or (description is not None and (type(description) is not str
                                             or "\x00" in description))
            or hashed is False
        ):
            spec, findings = check_table(name, table, now, file, line_of, spec_needed)[1:]  # errors
        else:
            rest = table.copy()
            rest.pop("task", None)
            rest.pop("description", None)
            # repr tells 1 from 1.0 from true from "1", and holds nested values: equal texts,
            # equal tables (key order included)
            # and a cron's H resolved for the name: what the findings then depend on
            key = (repr(rest), task is not None, description is not None, hashed)
            memo.tries += 1
            found = memo.tables.get(key)
            if found is None:
                errors, spec, findings = check_table(name, table, now, file, line_of, spec_needed)
                if not errors:
                    if len(memo.tables) >= memo.LIMIT:
                        memo.tables.clear()
                    memo.tables[key] = (spec, findings)
            else:
                memo.hits += 1
                template, findings = found
                spec = (
                    template.renamed(
                        name,
                        intern(task) if task else task,
                        intern(description) if description else description,
                        file,
                        line_of(),
                    )
                    if template is not None
                    else None
                )
    if not findings:
        return spec, []
    return spec, [Diagnostic(file, line_of(*path), name, message, severity)
                  for path, message, severity in findings
                  if warnings_needed or severity is Severity.ERROR]  # fmt: skip
