"""Calendars in schedule files: ``[calendars.NAME]`` tables -> :class:`Calendar` values, every
problem with file and line; a schedule's ``calendar = "NAME"`` resolved once every file is read
(a calendar may be defined in any file of the set). docs/schedules.md ("Calendars") is the
reference for operators.

- A calendar has ``dates`` (an array of ``"YYYY-MM-DD"`` strings or TOML dates) and/or ``ics``
  (an iCalendar file, its path relative to the schedule file that names it). Both given: their
  dates together. Neither: an error.
- From an ``ics``, every all-day event (a ``DTSTART`` that is a date) lists each day from its
  start up to, not including, its end (``DTEND``; one day without one); recurring events
  (``RRULE``, ``RDATE``, ``EXDATE``, moved occurrences) are expanded by
  ``recurring-ical-events`` over :data:`ICS_YEARS` calendar years from 1 January of the year of
  the load. Cancelled events list nothing; timed events are left out with a warning (a calendar
  lists whole days).
- Errors: an unknown key (did you mean), a bad name, ``dates`` not an array, an item that is not
  a date, an ``ics`` that cannot be read or is not iCalendar, the same calendar name in two
  files (both definitions; schedules naming it are not loaded); a schedule naming an unknown
  calendar (did you mean) or one that lists no dates; ``on_calendar`` without ``calendar``.
- Warning: a calendar whose last date is less than :data:`RENEW_WITHIN_DAYS` days after the
  load's ``now`` (UTC date): a holiday list that was never renewed is a silent future bug.

Reading an ``ics`` imports ``icalendar`` (and ``recurring-ical-events``) then, not before: a set
without one pays nothing for them.
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from cronkeeper.schedule import values as v
from cronkeeper.schedule.diagnostics import Diagnostic, Severity
from cronkeeper.timing.calendars import Calendar

CALENDARS_KEY = "calendars"  # the top-level table that holds them: never a schedule's name
KEYS = ("dates", "ics")
ICS_YEARS = 3  # an ics's recurring events are expanded over this many calendar years
RENEW_WITHIN_DAYS = 30
MAX_ICS_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CalendarDef:
    """One ``[calendars.NAME]`` table; ``calendar`` is None when it has errors (reported)."""

    name: str
    file: str
    line: int
    calendar: Calendar | None


@dataclass(frozen=True, slots=True)
class CalendarRef:
    """A schedule's ``calendar = "NAME"`` (a valid name), resolved once every file is read."""

    schedule: str
    calendar: str
    file: str
    line: int


def name_problem(value: Any) -> str | None:
    """Why a schedule's ``calendar`` value cannot name a calendar, or None."""
    if not isinstance(value, str):
        return f"'calendar' must be a string naming a [calendars.NAME] table, not {v.type_name(value)}"
    if v.NAME_RE.fullmatch(value) is None:
        return (f"'calendar' {v.shown(value)} is not a calendar name: calendar names are "
                f"schedule names ({v.NAME_RE.pattern})")
    return None


def read_calendars(
    value: Any, *, file: str, line_of: Callable[..., int], now: datetime, warnings: bool = True
) -> tuple[list[CalendarDef], list[Diagnostic]]:
    """The calendars of one file's ``calendars`` table, and every problem with them."""
    diags: list[Diagnostic] = []
    if not isinstance(value, dict):
        diags.append(Diagnostic(file, line_of(CALENDARS_KEY), None, (
            f"'{CALENDARS_KEY}' holds calendars, one table each ([{CALENDARS_KEY}.NAME] with "
            f"dates = [...] and/or ics = \"FILE\"), not {v.type_name(value)}; a schedule "
            f"cannot be named '{CALENDARS_KEY}'")))
        return [], diags
    defs = []
    for name, table in value.items():
        line = line_of(CALENDARS_KEY, name)

        def report(message: str, *path: str, severity: Severity = Severity.ERROR,
                   _name: str = name) -> None:
            where = line_of(CALENDARS_KEY, _name, *path) if path else line_of(CALENDARS_KEY, _name)
            diags.append(Diagnostic(file, where, None, f"calendar '{_name}': {message}", severity))

        before = len(diags)
        calendar = _read_one(name, table, file, now, report)
        failed = any(d.severity is Severity.ERROR for d in diags[before:])
        defs.append(CalendarDef(name, file, line, None if failed else calendar))
        if not failed and warnings and calendar is not None:
            _warn_if_ending(calendar, now, report)
    return defs, diags


def _read_one(name: str, table: Any, file: str, now: datetime,
              report: Callable[..., None]) -> Calendar | None:
    if v.NAME_RE.fullmatch(name) is None:
        report(f"not a calendar name: calendar names are schedule names ({v.NAME_RE.pattern})")
    if not isinstance(table, dict):
        report(f"must be a table ([{CALENDARS_KEY}.{name}] with dates = [...] and/or "
               f"ics = \"FILE\"), not {v.type_name(table)}; schedules are not defined "
               f"under [{CALENDARS_KEY}]")
        return None
    for key in table:
        if key not in KEYS:
            message = f"unknown key '{key}'"
            close = difflib.get_close_matches(key, KEYS, n=1, cutoff=0.6)
            report(message + (f"; did you mean '{close[0]}'?" if close else
                              "; a calendar has 'dates' and/or 'ics'"), key)
    if "dates" not in table and "ics" not in table:
        report("neither 'dates' nor 'ics' is set: list the dates (dates = [\"2026-12-25\"]) "
               "or name an iCalendar file (ics = \"holidays.ics\")")
        return None
    dates: list[date] = []
    if "dates" in table:
        dates.extend(_dates(table["dates"], report))
    if "ics" in table:
        raw = table["ics"]
        if not isinstance(raw, str) or not raw:
            report(f"'ics' must be the path of an iCalendar file, not {v.type_name(raw)}", "ics")
        else:
            path = raw if os.path.isabs(raw) else os.path.join(os.path.dirname(file), raw)
            found = ics_dates(path, now)
            if isinstance(found, str):
                report(f"ics {raw!r}: {found}", "ics")
            else:
                days, timed = found
                dates.extend(days)
                if timed:
                    report(f"ics {raw!r}: {timed} event{'s' if timed != 1 else ''} with a time "
                           "of day left out (a calendar lists whole days: all-day events only)",
                           "ics", severity=Severity.WARNING)
    return Calendar.of(name, dates)


def _dates(raw: Any, report: Callable[..., None]) -> list[date]:
    if not isinstance(raw, list):
        report(f"'dates' must be an array of dates such as [\"2026-12-25\"], not "
               f"{v.type_name(raw)}", "dates")
        return []
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, date) and not isinstance(item, datetime):
            out.append(item)
            continue
        if isinstance(item, str) and len(item) == 10:
            try:
                out.append(date.fromisoformat(item))
                continue
            except ValueError:
                pass
        report(f"dates[{i}] is {v.shown(item)}, not a date: write \"YYYY-MM-DD\" "
               "(for example \"2026-12-25\")", "dates")
    return out


def _warn_if_ending(calendar: Calendar, now: datetime, report: Callable[..., None]) -> None:
    last = calendar.last_date()
    today = now.astimezone(UTC).date()
    if last is None or last >= today + timedelta(days=RENEW_WITHIN_DAYS):
        return
    when = (f"{(last - today).days} days from now" if last >= today
            else f"{(today - last).days} days ago")
    report(f"its last date is {last.isoformat()} ({when}): after it, every day fires; add "
           f"the dates to come (a holiday list that is not renewed skips nothing)",
           severity=Severity.WARNING)


def ics_dates(path: str, now: datetime) -> tuple[list[date], int] | str:
    """(the days its all-day events list, the number of timed events left out), or why the
    file cannot be read. The file is opened without blocking and must be a regular file of at
    most 16 MiB, as schedule files."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return "not a regular file"
            data = f.read(MAX_ICS_BYTES + 1)
    except OSError as exc:
        return f"cannot read file: {exc.strerror or exc}"
    if len(data) > MAX_ICS_BYTES:
        return "file is too large (at most 16 MiB)"
    start = date(now.year, 1, 1)
    end = date(now.year + ICS_YEARS, 1, 1)
    try:
        import icalendar
        import recurring_ical_events

        calendar = icalendar.Calendar.from_ical(data)
        if getattr(calendar, "name", None) != "VCALENDAR":
            return "not an iCalendar file (no VCALENDAR)"
        events = list(recurring_ical_events.of(calendar).between(start, end))
        return _event_days(events, start, end)
    except ImportError as exc:  # pragma: no cover - both are dependencies
        return f"cannot read iCalendar files: {exc} (pip install icalendar recurring-ical-events)"
    except Exception as exc:  # the parsers raise many kinds on hostile input: say what it was
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"not a valid iCalendar file: {v.shown(text, 160)}"


def _event_days(events: Iterable[Any], start: date, end: date) -> tuple[list[date], int]:
    days: list[date] = []
    timed = 0
    for event in events:
        if event.name != "VEVENT" or str(event.get("STATUS", "")).upper() == "CANCELLED":
            continue
        first = event["DTSTART"].dt
        if isinstance(first, datetime) or not isinstance(first, date):
            timed += 1
            continue
        last = event["DTEND"].dt if "DTEND" in event else first + timedelta(days=1)
        if isinstance(last, datetime) or not isinstance(last, date) or last <= first:
            last = first + timedelta(days=1)
        day = max(first, start)
        while day < min(last, end):
            days.append(day)
            day += timedelta(days=1)
    return days, timed


def defined(defs: Sequence[CalendarDef]) -> tuple[tuple[Calendar, str], ...]:
    """Each valid calendar defined exactly once, with its file (``ScheduleSet.calendars``)."""
    count: dict[str, int] = {}
    for d in defs:
        count[d.name] = count.get(d.name, 0) + 1
    return tuple((d.calendar, d.file) for d in defs
                 if d.calendar is not None and count[d.name] == 1)


def resolve(
    defs: Sequence[CalendarDef], refs: Sequence[CalendarRef]
) -> tuple[dict[str, Calendar], set[str], list[Diagnostic]]:
    """({schedule: its calendar}, schedules whose calendar cannot be resolved, diagnostics):
    a name defined twice is an error at each definition; a schedule naming an unknown calendar,
    or one that lists no dates, is an error at its ``calendar`` line. A schedule naming a
    calendar with errors of its own is not loaded (those errors say why)."""
    diags: list[Diagnostic] = []
    first: dict[str, CalendarDef] = {}
    duplicated: set[str] = set()
    for d in defs:
        other = first.get(d.name)
        if other is None:
            first[d.name] = d
            continue
        duplicated.add(d.name)
        for here, there in ((d, other), (other, d)):
            diags.append(Diagnostic(here.file, here.line, None,
                                    f"calendar '{d.name}': defined twice: also at "
                                    f"{there.file}:{there.line}"))
    resolved: dict[str, Calendar] = {}
    failed: set[str] = set()
    for ref in refs:
        found = first.get(ref.calendar)
        if found is None:
            close = difflib.get_close_matches(ref.calendar, list(first), n=1)
            hint = (f"; did you mean '{close[0]}'?" if close else
                    f"; define it as [{CALENDARS_KEY}.{ref.calendar}] in a schedule file")
            diags.append(Diagnostic(ref.file, ref.line, ref.schedule,
                                    f"unknown calendar '{ref.calendar}'{hint}"))
            failed.add(ref.schedule)
        elif ref.calendar in duplicated or found.calendar is None:
            failed.add(ref.schedule)
        elif not found.calendar.days:
            diags.append(Diagnostic(ref.file, ref.line, ref.schedule, (
                f"calendar '{ref.calendar}' ({found.file}:{found.line}) lists no dates, so it "
                "would skip nothing: give it dates, or remove 'calendar' and 'on_calendar'")))
            failed.add(ref.schedule)
        else:
            resolved[ref.schedule] = found.calendar
    return resolved, failed, diags
