"""Triggers: when a schedule fires, as a pure function of an instant (docs/schedules.md).

A cron trigger works one constant-offset segment of its zone at a time (between two offset
transitions), with naive local arithmetic inside it: local second ``L`` in a segment of offset
``o`` is the instant ``L - o``. cronie's DST rules fall out of how segments are stitched:

- elapsed-time crons (minute or hour field starting with ``*``) fire at every instant whose wall
  time matches: a fold's repeated hour is in two segments and fires twice; a gap's hour is in none.
- fixed-time crons keep a high-water mark ``H``, the latest local time any earlier segment
  covered. A segment fires only local times at or past ``H`` (a fold's second pass is below it, so
  it fires once, at its first occurrence), and when a segment starts past ``H`` (a gap), every
  matching local time in ``[H, start)`` fires once, at the instant the gap ends, merged with a
  regular fire at that instant. Each local time up to ``H`` is thus fired exactly once.

Instants are whole Unix seconds internally; the API takes and returns aware datetimes.
"""

from __future__ import annotations

import calendar
import functools
import math
import zoneinfo
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from cronkeeper.timing import hashed, zones
from cronkeeper.timing.cron import CronExpr, parse_cron
from cronkeeper.timing.errors import TimingError

DAY = 86400
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_SECOND = timedelta(seconds=1)
# Fires are computed before this instant (9998-01-01T00:00Z; datetime ends in 9999 and a zone's
# transitions are looked up a year ahead). timing.instants accepts exactly the instants before it.
LIMIT = zones.year_start(zones.MAX_YEAR)
CHUNK = 256  # most fire instants a trigger computes at once (a seconds cron names 86,400 a day)


def to_seconds(when: datetime, what: str = "time") -> int:
    """Whole Unix seconds at or before the aware datetime ``when`` (floor)."""
    if not isinstance(when, datetime):
        raise TimingError(f"{what} must be a datetime, not {type(when).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise TimingError(f"{what} must be timezone-aware (got naive {when.isoformat()})")
    return (when - zones.EPOCH) // _SECOND


def to_datetime(seconds: int) -> datetime:
    return zones.EPOCH + timedelta(seconds=seconds)


class Trigger:
    """When one schedule fires. Immutable; every method is a pure function of its arguments."""

    __slots__ = ()
    fixed_time: bool
    timezone: str

    def _chunks(self, start: int) -> Iterator[list[int]]:
        """Ascending, non-empty lists of fire instants (Unix seconds) ``>= start``; across
        lists strictly increasing."""
        raise NotImplementedError

    def next_fire(self, after: datetime) -> datetime | None:
        """The first fire instant strictly after ``after``, as an aware UTC datetime."""
        start = to_seconds(after, "after") + 1
        if start >= LIMIT:
            return None
        for chunk in self._chunks(start):
            return to_datetime(chunk[0])
        return None

    def fires(self, after: datetime, until: datetime) -> Iterator[datetime]:
        """Every fire instant ``t`` with ``after < t <= until``, ascending, aware UTC."""
        start = to_seconds(after, "after") + 1
        end = to_seconds(until, "until")
        return self._fires(start, end)

    def _fires(self, start: int, end: int) -> Iterator[datetime]:
        if start > min(end, LIMIT - 1):
            return
        epoch = zones.EPOCH
        for chunk in self._chunks(start):
            if chunk[-1] > end:
                yield from [
                    epoch + timedelta(seconds=v) for v in chunk[: bisect_left(chunk, end + 1)]
                ]
                return
            yield from [epoch + timedelta(seconds=v) for v in chunk]


@dataclass(frozen=True, slots=True)
class EveryTrigger(Trigger):
    """Fires at each instant whose Unix time is a multiple of ``period`` (UTC, any zone)."""

    period: int
    timezone: str
    fixed_time: bool = False

    def _chunks(self, start: int) -> Iterator[list[int]]:
        n = self.period
        first = -(-start // n) * n
        block = 4096 * n
        while first < LIMIT:
            stop = min(first + block, LIMIT)
            yield list(range(first, stop, n))
            first = -(-stop // n) * n

    def next_fire(self, after: datetime) -> datetime | None:
        """Arithmetic, not a chunk: the leader calls this for every schedule after each burst."""
        n = self.period
        first = -(-(to_seconds(after, "after") + 1) // n) * n
        return to_datetime(first) if first < LIMIT else None

    def _fires(self, start: int, end: int) -> Iterator[datetime]:
        n = self.period
        epoch = zones.EPOCH
        for v in range(-(-start // n) * n, min(end, LIMIT - 1) + 1, n):
            yield epoch + timedelta(seconds=v)


@functools.lru_cache(maxsize=4096)
def _times_of_day(expr: CronExpr) -> tuple[int, ...]:
    """Sorted seconds of the day the expression names; one table per distinct expression,
    shared by every trigger that uses it (a seconds cron names up to 86,400 of them)."""
    return tuple(h * 3600 + m * 60 + s for h in expr.hours for m in expr.minutes
                 for s in expr.seconds)


@functools.lru_cache(maxsize=32768)  # 14 month shapes per distinct expression, a few hundred B each
def _month_days(expr: CronExpr, first_weekday: int, length: int) -> tuple[int, ...]:
    """The days of a month of this shape (weekday of day 1, Monday = 0, as ``calendar``; length)
    that fire, ``L`` and ``#`` included (:meth:`CronExpr.month_days`)."""
    return expr.month_days((first_weekday + 1) % 7, length)


@dataclass(frozen=True, slots=True)
class CronTrigger(Trigger):
    """A cron expression in a zone, with cronie's DST rules (see the module docstring).

    Which days of a month fire is one function of the month's shape (``_month_days``); the one
    place a per-date rule (a calendar's excluded dates) would filter is the day loop of
    :meth:`local_matches`, before any time of the day is looked at.

    Holds no tables of its own: those are shared per expression (``_times_of_day``,
    ``_month_days``), so 100,000 schedules cost 100,000 small objects, not 100,000 tables."""

    expr: CronExpr
    zone: zoneinfo.ZoneInfo
    timezone: str
    fixed_time: bool

    def local_matches(self, lo: int, hi: int, shift: int = 0) -> Iterator[list[int]]:
        """Lists of ``L - shift`` for each local second ``L`` in ``[lo, hi)`` the cron names,
        ascending (``L`` counts naive local seconds since 1970-01-01T00:00), at most ``CHUNK``
        at a time: the next fire of a seconds cron costs one chunk, not a day of them."""
        if lo >= hi:
            return
        expr = self.expr
        tod = _times_of_day(expr)
        months = expr.months
        first_day, last_day = lo // DAY, (hi - 1) // DAY
        day = date.fromordinal(_EPOCH_ORDINAL + first_day)
        end = date.fromordinal(_EPOCH_ORDINAL + last_day)
        year, month, from_day = day.year, day.month, day.day
        while (year, month) <= (end.year, end.month):
            if month in months:
                ordinal0 = date(year, month, 1).toordinal() - _EPOCH_ORDINAL - 1
                for mday in _month_days(expr, *calendar.monthrange(year, month)):
                    if mday < from_day:
                        continue
                    n = ordinal0 + mday
                    if n > last_day:
                        return
                    base = n * DAY
                    i = 0 if base >= lo else bisect_left(tod, lo - base)
                    j = len(tod) if base + DAY <= hi else bisect_left(tod, hi - base)
                    b = base - shift
                    for k in range(i, j, CHUNK):
                        yield [b + x for x in tod[k:min(k + CHUNK, j)]]
            from_day = 1
            month += 1
            if month == 13:
                year, month = year + 1, 1

    def _segments(self, start: int) -> Iterator[tuple[int, int, int, int]]:
        """(segment start, segment end, offset before it, offset in it) from the segment
        holding ``start`` on; a segment is a stretch of constant UTC offset."""
        zone = self.zone
        prev = zones.previous_transition(zone, start)
        if prev is None:
            seg_start, before = start, zones.offset_at(zone, start)
            offset = before
        else:
            seg_start, before, offset = prev
        cursor = start
        while cursor < LIMIT:
            upto = min(cursor + 366 * DAY, LIMIT)
            for instant, _, after in zones.transitions(zone, cursor + 1, upto + 1):
                yield seg_start, instant, before, offset
                seg_start, before, offset = instant, offset, after
            if seg_start < upto:  # cut long segments (zones without DST) a year at a time
                yield seg_start, upto, before, offset
                seg_start, before = upto, offset
            cursor = upto

    def _chunks(self, start: int) -> Iterator[list[int]]:
        if self.expr.never_fires():
            return
        fixed = self.fixed_time
        last = start - 1
        high: int | None = None  # fixed-time high-water mark (local seconds)
        for seg_start, seg_end, before, offset in self._segments(start):
            lo, hi = seg_start + offset, seg_end + offset
            if fixed:
                if high is None:
                    high = seg_start + before
                if high < lo and seg_start >= start:
                    for _ in self.local_matches(high, lo):  # a gap that names a time
                        last = seg_start
                        yield [seg_start]
                        break
                lo = max(lo, high)
                high = max(high, hi)
            for chunk in self.local_matches(max(lo, start + offset), hi, offset):
                if chunk[0] <= last:
                    chunk = [v for v in chunk if v > last]
                    if not chunk:
                        continue
                last = chunk[-1]
                yield chunk


def make_trigger(
    *, cron: str | None, every: float | None, timezone: str, name: str | None = None
) -> Trigger:
    """The trigger of one schedule: exactly one of ``cron`` and ``every`` (seconds). ``name``,
    the schedule's, is what a cron's ``H`` hashes (:mod:`cronkeeper.timing.hashed`); it is
    resolved first, so two schedules whose ``H`` land on the same values share a trigger.

    Triggers are immutable, so schedules with the same cron (or every) and zone share one
    instance: the leader's per-schedule state is a reference, and a tick can work each distinct
    trigger out once for all the schedules that share it."""
    if type(cron) is str and ("H" in cron or "h" in cron) and hashed.uses_hash(cron):
        cron = hashed.resolve(cron, name)
    if isinstance(every, bool) or not (every is None or isinstance(every, int | float)):
        return _make_trigger(cron, every, timezone)  # uncached: the error says what is wrong
    try:
        return _shared_trigger(cron, every, timezone)
    except TypeError:  # unhashable input: let the uncached path explain it
        return _make_trigger(cron, every, timezone)


@functools.lru_cache(maxsize=65536)
def _shared_trigger(cron: str | None, every: float | None, timezone: str) -> Trigger:
    return _make_trigger(cron, every, timezone)


def _make_trigger(cron: str | None, every: float | None, timezone: str) -> Trigger:
    zone = zones.load_zone(timezone)
    if (cron is None) == (every is None):
        raise TimingError("a schedule needs exactly one of 'cron' and 'every'")
    if cron is not None:
        expr = parse_cron(cron)
        return CronTrigger(expr=expr, zone=zone, timezone=timezone, fixed_time=expr.fixed_time)
    if (
        isinstance(every, bool)
        or not isinstance(every, int | float)
        or not math.isfinite(every)
        or every < 1
        or every != int(every)
    ):
        raise TimingError(f"every must be a whole number of seconds, at least 1s (got {every!r})")
    return EveryTrigger(period=int(every), timezone=timezone)
