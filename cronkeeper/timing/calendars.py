"""Calendars: the local dates on which a schedule does not fire (docs/schedules.md, "Calendars").

A :class:`Calendar` is a name and a set of dates, read in each schedule's own zone: a period is
*on* a listed date when its instant's local date (in the schedule's ``timezone``) is listed
(:meth:`Calendar.lists`). Deciding to skip such a period is the planner's
(``cronkeeper/planning.py``, reason ``calendar``); this module says which dates are listed and,
for ``on_calendar = "next_day"``, where the skipped fires move to.

:class:`MovedTrigger` is a trigger's fires plus the moved ones. For each run of consecutive
listed dates, the times of day the trigger names on those dates (a cron: the local times its
fields name, so a fixed time that a DST gap moved still moves as the time it names; ``every``:
the wall times of its fires) fire on the first unlisted day after the run, each time once. A
time that day does not have (a DST gap) fires at the gap's end, and one it has twice (a fold)
at its first occurrence: §4's fixed-time rule, whatever the cron's class. A moved fire at an
instant the trigger fires anyway is that one fire (one period, one job).

Pure: instants are arguments; the zone's offsets come from :mod:`cronkeeper.timing.zones`.
"""

from __future__ import annotations

import functools
import json
import zoneinfo
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime

from cronkeeper.timing import zones
from cronkeeper.timing.triggers import DAY, LIMIT, CronTrigger, Trigger, to_seconds

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
# Every UTC offset in the tz database lies within these bounds (-12:00 .. +14:00), with room.
_WEST, _EAST = 15 * 3600, 15 * 3600


def day_number(d: date) -> int:
    """Days since 1970-01-01."""
    return d.toordinal() - _EPOCH_ORDINAL


def day_date(n: int) -> date:
    return date.fromordinal(n + _EPOCH_ORDINAL)


@dataclass(frozen=True, slots=True)
class Calendar:
    """A named set of local dates, ``days`` sorted and unique (days since 1970-01-01). Frozen
    and hashable (the hash is worked out once): schedules that name one calendar share it."""

    name: str
    days: tuple[int, ...]
    _set: frozenset[int] = field(init=False, repr=False, compare=False)
    _hash: int = field(init=False, repr=False, compare=False)
    _json: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_set", frozenset(self.days))
        object.__setattr__(self, "_hash", hash((self.name, self.days)))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, name: str, dates: Iterable[date]) -> Calendar:
        return shared(name, tuple(sorted({day_number(d) for d in dates})))

    def dates(self) -> list[date]:
        return [day_date(n) for n in self.days]

    def iso_dates(self) -> list[str]:
        return [day_date(n).isoformat() for n in self.days]

    def last_date(self) -> date | None:
        return day_date(self.days[-1]) if self.days else None

    def lists_day(self, day: int) -> bool:
        return day in self._set

    def lists(self, when: datetime, zone: zoneinfo.ZoneInfo) -> bool:
        """Whether the local date of the instant ``when`` (aware) in ``zone`` is listed."""
        return self.lists_day(day_number(when.astimezone(zone).date()))

    def lists_second(self, seconds: int, zone: zoneinfo.ZoneInfo) -> bool:
        """:meth:`lists` for an instant in whole Unix seconds."""
        return self.lists_day((seconds + zones.offset_at(zone, seconds)) // DAY)

    def to_json(self) -> dict[str, object]:
        """What a stored spec holds of it: the name and every date, so an audit of a past
        period reads the dates that were in force, whatever the files say now."""
        return {"name": self.name, "dates": self.iso_dates()}

    def canonical_json(self) -> str:
        """``to_json()`` as canonical JSON (sorted keys, no spaces), worked out once."""
        text = self._json
        if text is None:
            text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
            object.__setattr__(self, "_json", text)
        return text

    def runs(self) -> tuple[tuple[int, int], ...]:
        """(first day, last day) of each run of consecutive listed days, ascending."""
        return _runs(self.days)


@functools.lru_cache(maxsize=1024)
def shared(name: str, days: tuple[int, ...]) -> Calendar:
    """One Calendar instance per distinct value: 100,000 stored versions naming one calendar
    hold one object (and one family for the leader's plans)."""
    return Calendar(name, days)


@functools.lru_cache(maxsize=1024)
def _runs(days: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    runs: list[tuple[int, int]] = []
    for day in days:
        if runs and runs[-1][1] == day - 1:
            runs[-1] = (runs[-1][0], day)
        else:
            runs.append((day, day))
    return tuple(runs)


@dataclass(frozen=True, slots=True)
class MovedTrigger(Trigger):
    """``base``'s fires plus, for each run of dates ``calendar`` lists, the fires moved to the
    next unlisted day (see the module docstring). The fires on listed dates stay: they are
    periods, which the planner skips with reason ``calendar``."""

    base: Trigger
    calendar: Calendar
    zone: zoneinfo.ZoneInfo
    timezone: str
    fixed_time: bool

    def _chunks(self, start: int) -> Iterator[list[int]]:
        moved = self._moved(start)
        pending = next(moved, None)
        for chunk in self.base._chunks(start):
            if pending is None or pending > chunk[-1]:
                yield chunk
                continue
            merged: list[int] = []
            for v in chunk:
                while pending is not None and pending < v:
                    merged.append(pending)
                    pending = next(moved, None)
                if pending == v:  # a moved fire where the trigger fires anyway: one fire
                    pending = next(moved, None)
                merged.append(v)
            yield merged
        rest = [] if pending is None else [pending, *moved]
        if rest:
            yield rest

    def _moved(self, start: int) -> Iterator[int]:
        """The moved fires ``>= start`` (Unix seconds), ascending."""
        runs = self.calendar.runs()
        # a run's fires move to the day after its last; that day's instants are all before
        # (day + 1) * DAY + _WEST
        i = bisect_left(runs, start - _WEST - DAY, key=lambda run: (run[1] + 1) * DAY)
        for first, last in runs[i:]:
            for t in moved_fires(self, first, last):
                if t >= start:
                    yield t

    def origin(self, when: datetime) -> list[date]:
        """The listed dates whose fires moved to ``when``; empty when ``when`` is not a moved
        fire, or is one of the trigger's own fires too (then it is that fire)."""
        t = to_seconds(when, "when")
        day = (t + zones.offset_at(self.zone, t)) // DAY
        runs = self.calendar.runs()
        i = bisect_right(runs, day - 1, key=lambda run: run[1]) - 1
        if i < 0 or runs[i][1] != day - 1 or t not in moved_fires(self, *runs[i]):
            return []
        for own in self.base._chunks(t):
            if own[0] == t:
                return []
            break
        first, last = runs[i]
        return [day_date(d) for d in range(first, last + 1)
                if t in _instants_on(self.zone, last + 1,
                                     sorted(set(_times_of_day(self.base, self.zone, d))))]


@functools.lru_cache(maxsize=4096)
def moved_fires(trigger: MovedTrigger, first: int, last: int) -> tuple[int, ...]:
    """The instants (Unix seconds, ascending, unique) that the fires of the listed days
    ``first``..``last`` move to, on day ``last + 1``. Remembered per run: the leader asks for
    the same run at every tick until its day is past."""
    seconds: set[int] = set()
    for day in range(first, last + 1):
        seconds.update(_times_of_day(trigger.base, trigger.zone, day))
    return _instants_on(trigger.zone, last + 1, sorted(seconds))


def _times_of_day(base: Trigger, zone: zoneinfo.ZoneInfo, day: int) -> Iterator[int]:
    """Seconds of the local day ``day`` at which ``base`` fires: the times a cron names that
    day; for anything else, the wall times of its fires whose local date is that day."""
    lo = day * DAY
    if isinstance(base, CronTrigger):
        for chunk in base.local_matches(lo, lo + DAY):
            for local in chunk:
                yield local - lo
        return
    for seg_start, seg_end, offset in _segments(zone, lo - _EAST, lo + DAY + _WEST):
        for chunk in base._chunks(seg_start):
            done = False
            for t in chunk:
                if t >= seg_end:
                    done = True
                    break
                local = t + offset
                if lo <= local < lo + DAY:
                    yield local - lo
            if done:
                break


def _segments(zone: zoneinfo.ZoneInfo, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """(start, end, offset) of the stretches of constant offset covering ``[lo, hi)``."""
    out: list[tuple[int, int, int]] = []
    start, offset = lo, zones.offset_at(zone, lo)
    for instant, _, after in zones.transitions(zone, lo + 1, hi):
        out.append((start, instant, offset))
        start, offset = instant, after
    out.append((start, hi, offset))
    return out


def _instants_on(zone: zoneinfo.ZoneInfo, day: int, seconds: list[int]) -> tuple[int, ...]:
    """The instants of the local times ``day`` + each of ``seconds``, by the fixed-time rule:
    the first occurrence of a time a fold repeats, the gap's end for a time a gap skips."""
    lo = day * DAY
    segments = _segments(zone, lo - _EAST, lo + DAY + _WEST)
    if len(segments) == 1:  # no offset change near the day: the common case
        offset = segments[0][2]
        found = [lo + s - offset for s in seconds]
    else:
        found = []
        for s in seconds:
            local = lo + s
            own = [local - off for start, end, off in segments if start <= local - off < end]
            if own:
                found.append(min(own))
                continue
            # in a gap: the change whose wall times skip over ``local``
            found.extend(start for (_, _, before), (start, _, after) in zip(
                segments, segments[1:], strict=False) if start + before <= local < start + after)
    return tuple(sorted({t for t in found if t < LIMIT}))


@functools.lru_cache(maxsize=4096)
def moved_trigger(base: Trigger, calendar: Calendar) -> MovedTrigger:
    """The ``next_day`` trigger of ``base`` and ``calendar``, one instance per distinct pair
    (schedules that share both share it, as ``make_trigger`` shares triggers)."""
    zone = zones.load_zone(base.timezone)
    return MovedTrigger(base, calendar, zone, base.timezone, base.fixed_time)
