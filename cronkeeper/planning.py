"""What happens to each due period: a pure function of the spec, the due periods and the facts
gathered at the moment they are decided (database now, the schedule's pause spans, previous job
unfinished).

    plan(spec, due, now, paused=spans, busy=...) -> [Decision]

Rules (§6, §19):
- calendar: a period whose local date (in the schedule's zone) its calendar lists is skipped
  (reason ``calendar``), whatever else holds: it was never meant to fire, so neither a pause,
  nor lateness, nor a busy previous job is its reason. With ``on_calendar = "next_day"`` the
  moved fires are periods of their own (the trigger names them: ``timing.calendars``), decided
  by the rules below like any other.
- paused: a period due inside one of the schedule's pause spans, ``start <= p < end``
  (``PauseSpan``), is skipped (reason ``paused``), however late it is decided: pause is judged
  at each period's due instant (SPEC §4), so a period due before a pause and decided after it
  (a tick a moment late, a catch-up after an outage) goes through the rules below, and one due
  inside a span ended since is still skipped. ``paused=()``, the common case, costs nothing.
- misfire ``skip``: a period more than ``grace`` late is skipped (``misfire``).
- misfire ``catch_up``: periods at most ``catch_up_limit`` late are emitted, oldest first;
  older ones are skipped (``misfire``).
- misfire ``latest``: periods within ``grace`` are emitted; of the late ones only the newest
  is emitted, and only when no on-time period follows it; the rest are skipped (``coalesced``).
- overlap ``skip``: when the schedule's previous job is unfinished (``busy``: waiting to be
  claimed, running, or waiting to retry), every period that would be emitted is skipped
  (``overlap``). Periods emitted together in one decision are not judged against each other:
  a catch-up after an outage emits all its periods; ``overlap = "serial"`` makes workers run
  them one at a time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import NamedTuple
from zoneinfo import ZoneInfo

from cronkeeper.schedule.model import Misfire, Overlap, ScheduleSpec
from cronkeeper.timing import Trigger, load_zone
from cronkeeper.timing.calendars import Calendar, MovedTrigger


class Outcome(StrEnum):
    EMITTED = "emitted"
    SKIPPED = "skipped"


class Reason(StrEnum):
    MISFIRE = "misfire"
    OVERLAP = "overlap"
    PAUSED = "paused"
    COALESCED = "coalesced"
    BACKFILL = "backfill"
    CALENDAR = "calendar"


# A span a schedule was paused, [start, end): start None is since ever (a pause an older
# release wrote), end None is not resumed yet (db/schedule_pauses.py reads them).
PauseSpan = tuple[datetime | None, datetime | None]
ALWAYS_PAUSED: tuple[PauseSpan, ...] = ((None, None),)


def paused_at(spans: Sequence[PauseSpan], period: datetime) -> bool:
    """Whether ``period`` is due inside one of ``spans``: ``start <= period < end``."""
    return any((start is None or start <= period) and (end is None or period < end)
               for start, end in spans)


@dataclass(frozen=True, slots=True)
class Decision:
    scheduled_for: datetime
    outcome: Outcome
    reason: Reason | None = None


def key_stamp(scheduled_for: datetime) -> str:
    """The instant part of an idempotency key, ``YYYY-MM-DDTHH:MM:SSZ`` (``scheduled_for`` is
    aware UTC). Remembered: a burst's periods share a handful of instants."""
    return _stamp(scheduled_for)


@functools.lru_cache(maxsize=1024)
def _stamp(scheduled_for: datetime) -> str:
    return scheduled_for.strftime("%Y-%m-%dT%H:%M:%SZ")


def idempotency_key(schedule: str, scheduled_for: datetime) -> str:
    """``<schedule>@<YYYY-MM-DDTHH:MM:SSZ>`` (docs/schedules.md): every job key of a period is
    made here, or from ``key_stamp`` by the claim (db/periods_claims.py, the statement in SQL
    and the COPY writer), which tests hold equal to this."""
    return f"{schedule}@{key_stamp(scheduled_for)}"


def manual_key(schedule: str, now: datetime) -> str:
    """A manual ``trigger``'s job key, ``<schedule>@manual:<YYYY-MM-DDTHH:MM:SS.ffffffZ>``: never
    a period's (``period_of_key`` names no period for it)."""
    return f"{schedule}@manual:{now.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


def period_of_key(key: str) -> tuple[str, datetime] | None:
    """The (schedule, scheduled_for) a period's key names; None for a key that names none (a
    manual ``trigger``'s ``NAME@manual:...``, an application's own key)."""
    name, sep, at = key.rpartition("@")
    if not sep:
        return None
    try:
        return name, datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        return None


def on_listed_date(spec: ScheduleSpec, scheduled_for: datetime) -> bool:
    """Whether the period at ``scheduled_for`` falls on a local date the schedule's calendar
    lists: the one test of it (the planner and ``next`` ask here; the audit, in Unix seconds,
    through ``listed_test``)."""
    calendar = spec.calendar
    return calendar is not None and calendar.lists(scheduled_for, load_zone(spec.timezone))


def listed_test(spec: ScheduleSpec) -> Callable[[int], bool] | None:
    """``on_listed_date`` for periods in Unix seconds; None for a spec without a calendar."""
    calendar = spec.calendar
    if calendar is None:
        return None
    return functools.partial(_lists_second, calendar, load_zone(spec.timezone))


def _lists_second(calendar: Calendar, zone: ZoneInfo, at: int) -> bool:
    return calendar.lists_second(at, zone)


class CalendarMark(NamedTuple):
    """How a fire stands to the schedule's calendar, for people reading its next fires:
    ``kind`` ``skipped`` (on a listed date: skipped, reason ``calendar``; ``days`` is that
    date) or ``moved`` (a fire ``on_calendar = "next_day"`` moved from the listed ``days``)."""

    kind: str
    days: tuple[date, ...]
    text: str


def calendar_mark(spec: ScheduleSpec, trigger: Trigger, at: datetime) -> CalendarMark | None:
    """The :class:`CalendarMark` of a fire of ``trigger`` (``spec.trigger()``) at ``at``."""
    calendar = spec.calendar
    if calendar is None:
        return None
    if on_listed_date(spec, at):
        day = at.astimezone(load_zone(spec.timezone)).date()
        return CalendarMark("skipped", (day,), f"skipped: calendar '{calendar.name}' lists {day}")
    origin = tuple(trigger.origin(at)) if isinstance(trigger, MovedTrigger) else ()
    if not origin:
        return None
    days = ", ".join(map(str, origin))
    return CalendarMark("moved", origin, f"moved from {days} (calendar '{calendar.name}' "
                                         f"lists {'them' if len(origin) > 1 else 'it'})")


def plan(
    spec: ScheduleSpec,
    due: Sequence[datetime],
    now: datetime,
    *,
    paused: Sequence[PauseSpan],
    busy: bool,
) -> list[Decision]:
    if spec.calendar is not None:
        on = [on_listed_date(spec, p) for p in due]
        if any(on):
            rest = [p for p, listed in zip(due, on, strict=True) if not listed]
            decisions = [Decision(p, Outcome.SKIPPED, Reason.CALENDAR)
                         for p, listed in zip(due, on, strict=True) if listed]
            decisions += _plan(spec, rest, now, paused=paused, busy=busy)
            decisions.sort(key=lambda d: d.scheduled_for)
            return decisions
    return _plan(spec, due, now, paused=paused, busy=busy)


def _plan(
    spec: ScheduleSpec, due: Sequence[datetime], now: datetime, *,
    paused: Sequence[PauseSpan], busy: bool
) -> list[Decision]:
    decisions: list[Decision] = []
    if paused:
        held = [paused_at(paused, p) for p in due]
        if any(held):
            decisions = [Decision(p, Outcome.SKIPPED, Reason.PAUSED)
                         for p, h in zip(due, held, strict=True) if h]
            due = [p for p, h in zip(due, held, strict=True) if not h]
    emit, skipped = _apply_misfire(spec, due, now)
    decisions += skipped
    for period in emit:
        if busy and spec.overlap is Overlap.SKIP:
            decisions.append(Decision(period, Outcome.SKIPPED, Reason.OVERLAP))
        else:
            decisions.append(Decision(period, Outcome.EMITTED))
    decisions.sort(key=lambda d: d.scheduled_for)
    return decisions


def _apply_misfire(
    spec: ScheduleSpec, due: Sequence[datetime], now: datetime
) -> tuple[list[datetime], list[Decision]]:
    """Split due periods into those to emit and the decisions already taken (skipped)."""
    emit: list[datetime] = []
    skipped: list[Decision] = []
    if spec.misfire is Misfire.CATCH_UP:
        for period in due:
            if (now - period).total_seconds() <= spec.catch_up_limit:
                emit.append(period)
            else:
                skipped.append(Decision(period, Outcome.SKIPPED, Reason.MISFIRE))
        return emit, skipped
    on_time = [p for p in due if (now - p).total_seconds() <= spec.grace]
    late = [p for p in due if (now - p).total_seconds() > spec.grace]
    if spec.misfire is Misfire.SKIP:
        skipped = [Decision(p, Outcome.SKIPPED, Reason.MISFIRE) for p in late]
        return on_time, skipped
    # latest: the newest late period stands for the others, unless an on-time one follows it
    if late and not on_time:
        emit.append(late[-1])
        late = late[:-1]
    skipped = [Decision(p, Outcome.SKIPPED, Reason.COALESCED) for p in late]
    return emit + on_time, skipped
