"""The rules of one schedule table: its keys and values -> the findings, and the spec when there
is no error. :mod:`cronkeeper.schedule.validate` applies them with file and line.

Rules (docs/schedules.md is the reference):

- exactly one of ``cron`` / ``every``; exactly one of ``task`` / ``command``;
- ``timezone`` and ``misfire`` are required: the silent default is how runs go missing;
- ``catch_up_limit`` with a misfire other than ``catch_up`` is an **error**, not a warning: the
  value would be silently ignored, and whoever wrote it believes missed periods are caught up;
- ``permanent_exit_codes`` on a ``task`` schedule is an error for the same reason;
- ``every`` is a whole number of seconds, at least 1 s; ``timeout`` and ``backoff.base`` are
  greater than zero; ``grace``, ``jitter`` and ``catch_up_limit`` at least zero (the last greater;
  ``grace`` at least 1 s with ``misfire = "skip"``, which would otherwise skip every period);
  ``backoff.max`` at least ``backoff.base``; ``1 <= backoff.factor <= 100``;
  ``1 <= max_attempts <= 1000``; every duration at most 3660 days; ``output_limit`` a size
  (``"64KiB"``) of at most 1 MiB (``"0B"`` keeps nothing);
- warnings: a deprecated zone alias, a fixed local time in a DST gap or fold in the coming
  year, ``timeout`` longer than the interval with ``overlap = "allow"``, no ``owner``.

Checks of when a schedule fires live in :mod:`cronkeeper.schedule.timing_checks`, cached per
distinct value; the backoff table's checks are cached per distinct table here.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from sys import intern  # repeated values kept once (see model.shared_text)
from typing import Any

from cronkeeper.schedule import calendars
from cronkeeper.schedule import timing_checks as timing
from cronkeeper.schedule import values as v
from cronkeeper.schedule.diagnostics import Severity
from cronkeeper.schedule.model import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_BACKOFF_MAX,
    DEFAULT_CATCH_UP_LIMIT,
    DEFAULT_GRACE,
    DEFAULT_JITTER,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_OUTPUT_LIMIT,
    DEFAULT_TIMEOUT,
    MAX_OUTPUT_LIMIT,
    Backoff,
    Misfire,
    OnCalendar,
    Overlap,
    ScheduleSpec,
    shared_backoff,
)

KEYS = (
    "cron", "every", "timezone", "misfire", "catch_up_limit", "overlap", "task", "command",
    "payload", "grace", "jitter", "timeout", "max_attempts", "backoff", "permanent_exit_codes",
    "owner", "description", "output_limit", "calendar", "on_calendar",
)  # fmt: skip
_KNOWN_KEYS = frozenset(KEYS)
BACKOFF_KEYS = ("base", "factor", "max")
MAX_ATTEMPTS_LIMIT = 1000
MAX_BACKOFF_FACTOR = 100.0
MIN_SKIP_GRACE = 1.0  # below it, with misfire "skip", every period is decided too late


def unknown_key_message(key: str, known: tuple[str, ...], where: str = "") -> str:
    message = f"unknown key '{key}'{where}"
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        message += f"; did you mean '{close[0]}'?"
    return message


# One problem of a schedule before it has a file and line: (key path, message, severity).
Finding = tuple[tuple[str, ...], str, Severity]


def check_table(
    name: str,
    table: dict[str, Any],
    now: datetime,
    file: str,
    line_of: Callable[..., int],
    spec_needed: bool,
) -> tuple[int, ScheduleSpec | None, tuple[Finding, ...]]:
    """(number of errors, the spec if there is no error and it is needed, every finding)."""
    findings: list[Finding] = []
    errors = 0

    def report(message: str, path: tuple[str, ...] = (), severity: Severity = Severity.ERROR):
        nonlocal errors
        if severity is Severity.ERROR:
            errors += 1
        findings.append((path, message, severity))

    def err(message: str, *path: str) -> None:
        report(message, path)

    def warn(message: str, *path: str) -> None:
        report(message, path, Severity.WARNING)

    problem = v.name_problem(name)
    if problem is not None:
        err(problem)

    for key, value in table.items():
        if not isinstance(key, str):  # (a runtime spec's mapping: a file's keys are strings)
            err(f"a key must be a string, not {v.type_name(key)} ({v.shown(key)})")
        elif key not in _KNOWN_KEYS:
            if isinstance(value, dict) and any(k in _KNOWN_KEYS for k in value):
                # [nightly.backup] is a table 'backup' inside 'nightly', not one schedule.
                quoted = f"{name}.{key}"
                message = (
                    f"unknown key '{key}' (a table); if '{quoted}' is meant as one schedule's "
                    f"name, quote it: [\"{quoted}\"]"
                )
            else:
                message = unknown_key_message(key, KEYS)
            err(message, key)

    # -- when: cron | every, timezone ---------------------------------------------------------
    cron = table.get("cron")
    every_raw = table.get("every")
    every: float | None = None
    if cron is not None and every_raw is not None:
        err("both 'cron' and 'every' are set; keep one", "every")
    elif cron is None and every_raw is None:
        err("neither 'cron' nor 'every' is set: say when the schedule fires")
    cron_ok = False
    resolved = cron  # the cron with its H resolved for this name, once it is a valid string
    if cron is not None:
        problem = v.string("cron", cron)
        warnings: tuple[str, ...] = ()
        if problem is None:
            problem, warnings, resolved = timing.cron_check(cron, name)
        if problem is not None:
            err(problem, "cron")
        else:
            cron_ok = True
            for message in warnings:
                warn(message, "cron")
    if every_raw is not None:
        result = v.duration("every", every_raw, minimum=1.0)
        if isinstance(result, str):
            err(result, "every")
        elif result != int(result):
            err(f"'every' must be a whole number of seconds, got {v.shown(every_raw)}", "every")
        else:
            every = result

    timezone = table.get("timezone")
    zone_ok = False
    if timezone is None:
        err("missing required key 'timezone': an IANA name such as \"UTC\" or "
            "\"Europe/Berlin\" (there is no default)")  # fmt: skip
    else:
        problem = v.string("timezone", timezone)
        if problem is None:
            problem, alias = timing.zone_check(timezone)
            if alias is not None:
                warn(f"timezone '{timezone}' is a deprecated alias; use '{alias}'", "timezone")
        if problem is not None:
            err(problem, "timezone")
        else:
            zone_ok = True

    # -- policies -------------------------------------------------------------------------------
    misfire = _enum(table, "misfire", Misfire, err, required=True)
    overlap = _enum(table, "overlap", Overlap, err, required=False) or Overlap.SKIP

    catch_up_limit = DEFAULT_CATCH_UP_LIMIT
    if "catch_up_limit" in table:
        result = v.duration("catch_up_limit", table["catch_up_limit"], strict=True)
        if isinstance(result, str):
            err(result, "catch_up_limit")
        else:
            catch_up_limit = result
        if misfire is not None and misfire is not Misfire.CATCH_UP:
            err(f"'catch_up_limit' applies only with misfire = \"catch_up\" (this schedule has "
                f"misfire = \"{misfire}\"); remove it or change misfire", "catch_up_limit")  # fmt: skip

    # -- calendar: its name here; its dates once every file is read (schedule.calendars) ----------
    on_calendar = _enum(table, "on_calendar", OnCalendar, err, required=False) or OnCalendar.SKIP
    if "calendar" in table and (problem := calendars.name_problem(table["calendar"])):
        err(problem, "calendar")
    elif "on_calendar" in table and "calendar" not in table:
        err("'on_calendar' applies only with 'calendar' (the dates it is about); name the "
            "calendar or remove it", "on_calendar")  # fmt: skip

    # -- what: task | command, payload -----------------------------------------------------------
    task = table.get("task")
    command = table.get("command")
    if task is not None and command is not None:
        err("both 'task' and 'command' are set; keep one", "command")
    elif task is None and command is None:
        err("neither 'task' nor 'command' is set: say what the job is")
    if task is not None and (problem := v.task_problem(task)) is not None:
        err(problem, "task")
    if command is not None and (problem := v.command_problem(command)) is not None:
        err(problem, "command")

    payload_json = "{}"
    if "payload" in table:
        checked = v.payload_json(table["payload"])
        if isinstance(checked, tuple):
            err(checked[0], "payload", *checked[1])
        else:
            payload_json = checked

    # -- durations and retries --------------------------------------------------------------------
    def dur(key: str, default: float, **bounds: Any) -> float:
        if key not in table:
            return default
        result = v.duration(key, table[key], **bounds)
        if isinstance(result, str):
            err(result, key)
            return default
        return result

    grace = dur("grace", DEFAULT_GRACE)
    if misfire is Misfire.SKIP and grace < MIN_SKIP_GRACE:
        err(f"grace must be at least {MIN_SKIP_GRACE:g}s with misfire = \"skip\": the leader "
            "decides a period a few milliseconds after it is due at the earliest, so every "
            "period would be skipped as a misfire and the schedule would never fire (use "
            "misfire = \"latest\" to run late periods)", "grace")
    jitter = dur("jitter", DEFAULT_JITTER)
    timeout = dur("timeout", DEFAULT_TIMEOUT, strict=True)

    max_attempts = DEFAULT_MAX_ATTEMPTS
    if "max_attempts" in table:
        attempts = v.integer("max_attempts", table["max_attempts"], low=1, high=MAX_ATTEMPTS_LIMIT)
        if isinstance(attempts, str):
            err(attempts, "max_attempts")
        else:
            max_attempts = attempts

    backoff = _backoff(table.get("backoff"), err) if "backoff" in table else shared_backoff()

    exit_codes: tuple[int, ...] = ()
    if "permanent_exit_codes" in table:
        codes = v.exit_codes(table["permanent_exit_codes"])
        if isinstance(codes, str):
            err(codes, "permanent_exit_codes")
        else:
            exit_codes = codes
        if task is not None and command is None:
            err("'permanent_exit_codes' applies only to 'command' schedules (a task handler "
                "raises PermanentError instead)", "permanent_exit_codes")  # fmt: skip

    output_limit = DEFAULT_OUTPUT_LIMIT
    if "output_limit" in table:
        limit = v.size("output_limit", table["output_limit"], high=MAX_OUTPUT_LIMIT)
        if isinstance(limit, str):
            err(limit, "output_limit")
        else:
            output_limit = limit

    # -- people -------------------------------------------------------------------------------
    owner = table.get("owner")
    if owner is None:
        warn("no 'owner': nobody will be alerted about its dead letters and missed periods")
    elif (problem := v.string("owner", owner)) is not None:
        err(problem, "owner")
    description = table.get("description")
    if description is not None and (problem := v.string("description", description, empty_ok=True)):
        err(problem, "description")

    # -- timing warnings, once what they need is valid --------------------------------------------
    if zone_ok and (cron_ok or every is not None) and not (cron_ok and every is not None):
        when = resolved if cron_ok else None
        for message in timing.dst_warnings(when, every, timezone, now):
            warn(message, "cron")
        if overlap is Overlap.ALLOW and (every is not None or timeout > timing.gap_floor(resolved)):
            interval = every if every is not None else timing.shortest_gap(resolved, now)
            if interval is not None and timeout > interval:
                what, key = (
                    (f"'timeout' ({v.shown(table['timeout'])})", "timeout")
                    if "timeout" in table
                    else ("the default timeout (10m)", "overlap")
                )
                shown = timing.fmt_interval(interval)
                warn(f"{what} is longer than the interval between fires "
                     f"({shown}) with overlap = \"allow\": runs can pile up; "
                     "shorten the timeout or use overlap = \"skip\" or \"serial\"", key)  # fmt: skip

    if errors or not spec_needed:
        return errors, None, tuple(findings)
    spec = ScheduleSpec(
        name=name,
        timezone=intern(timezone),  # type: ignore[arg-type]  # a str: no error
        misfire=misfire,  # not None: no error
        cron=intern(cron) if cron else cron,
        every=every,
        catch_up_limit=catch_up_limit,
        overlap=overlap,
        task=intern(task) if task else task,
        command=tuple(command) if command is not None else None,
        payload_json=intern(payload_json),
        grace=grace,
        jitter=jitter,
        timeout=timeout,
        max_attempts=max_attempts,
        backoff=backoff,
        permanent_exit_codes=exit_codes,
        owner=intern(owner) if owner else owner,
        description=intern(description) if description else description,
        output_limit=output_limit,
        on_calendar=on_calendar,
        file=file,
        line=line_of(),
    )
    return 0, spec, tuple(findings)


_CHOICES: dict[type[Enum], tuple[str, ...]] = {
    enum: tuple(str(m) for m in enum) for enum in (Misfire, Overlap, OnCalendar)}
_MEMBERS: dict[type[Enum], dict[str, Any]] = {enum: {str(m): m for m in enum} for enum in _CHOICES}


def _enum(table: dict[str, Any], key: str, enum: type[Enum], err: Callable[..., None], *, required: bool):
    value = table.get(key)
    if type(value) is str:  # the usual case: a valid choice
        member = _MEMBERS[enum].get(value)
        if member is not None:
            return member
    choices = _CHOICES[enum]
    if key not in table:
        if required:
            err(f"missing required key '{key}': one of {', '.join(choices)} "
                "(there is no default)")  # fmt: skip
        return None
    value = table[key]
    if not isinstance(value, str):
        err(f"'{key}' must be a string, one of {', '.join(choices)}; not {v.type_name(value)}", key)
        return None
    if value not in choices:
        message = f"'{key}' must be one of {', '.join(choices)}, not {v.shown(value)}"
        close = difflib.get_close_matches(value.lower().replace("-", "_"), choices, n=1)
        if close:
            message += f"; did you mean '{close[0]}'?"
        err(message, key)
        return None
    return enum(value)


_BACKOFFS: dict[str, tuple[Backoff, tuple[tuple[str, tuple[str, ...]], ...]]] = {}


def _backoff(raw: Any, err: Callable[..., None]) -> Backoff:
    """The backoff table's value, its problems reported: worked out once per distinct table."""
    key = repr(raw)
    found = _BACKOFFS.get(key)
    if found is None:
        problems: list[tuple[str, tuple[str, ...]]] = []
        backoff = _backoff_checked(raw, lambda message, *path: problems.append((message, path)))
        if len(_BACKOFFS) >= 4096:
            _BACKOFFS.clear()
        found = _BACKOFFS[key] = (backoff, tuple(problems))
    for message, path in found[1]:
        err(message, *path)
    return found[0]


def _backoff_checked(raw: Any, err: Callable[..., None]) -> Backoff:
    if not isinstance(raw, dict):
        err(f"'backoff' must be a table like {{ base = \"30s\", factor = 2, max = \"1h\" }}, "
            f"not {v.type_name(raw)}", "backoff")  # fmt: skip
        return Backoff()
    for key in raw:
        if key not in BACKOFF_KEYS:
            err(unknown_key_message(key, BACKOFF_KEYS, " in 'backoff'"), "backoff", key)
    base, factor, maximum = DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_FACTOR, DEFAULT_BACKOFF_MAX
    ok = True
    if "base" in raw:
        result = v.duration("backoff.base", raw["base"], strict=True)
        if isinstance(result, str):
            err(result, "backoff", "base")
            ok = False
        else:
            base = result
    if "factor" in raw:
        result = v.number("backoff.factor", raw["factor"], low=1.0, high=MAX_BACKOFF_FACTOR)
        if isinstance(result, str):
            err(result, "backoff", "factor")
        else:
            factor = result
    if "max" in raw:
        result = v.duration("backoff.max", raw["max"], strict=True)
        if isinstance(result, str):
            err(result, "backoff", "max")
            ok = False
        else:
            maximum = result
    if ok and maximum < base:
        err(f"'backoff.max' ({maximum:g}s) is shorter than 'backoff.base' ({base:g}s)",
            "backoff", "max" if "max" in raw else "base")  # fmt: skip
    return shared_backoff(base, factor, maximum)
