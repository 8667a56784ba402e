"""Checks of when a schedule fires: its cron expression, zone, DST warnings and interval.

Each is a pure function of its inputs, cached per distinct value: a directory of 100,000
generated schedules shares a few hundred zones and fields and tens of thousands of crons.
"""

from __future__ import annotations

import functools
import itertools
from datetime import datetime, timedelta
from typing import Any

from cronkeeper.schedule import values as v
from cronkeeper.timing import (
    TimingError,
    deprecated_zone_alias,
    dst_anomalies,
    load_zone,
    make_trigger,
    parse_cron,
    resolve,
    uses_hash,
    zones,
)

# How far ahead DST anomalies are looked for, and how many fires measure a cron's interval.
DST_HORIZON = timedelta(days=366)
INTERVAL_FIRES = 8
INTERVAL_HORIZON = timedelta(days=4 * 366)


def cron_check(expr: str, name: str) -> tuple[str | None, tuple[str, ...], str]:
    """(the error of the cron expression of schedule ``name``, or None; its warnings; the
    expression with its ``H`` resolved for the name, which every later check reads)."""
    if ("H" not in expr and "h" not in expr) or not uses_hash(expr):
        return _plain_cron_check(expr)
    try:
        resolved = resolve(expr, name)
    except TimingError as exc:
        return f"cron {v.shown(expr)}: {exc}", (), expr
    return (*_cron_check(resolved, f"{v.shown(expr)} (for this schedule: {v.shown(resolved)})"),
            resolved)  # fmt: skip


def hashed_cron(name: str, cron: Any) -> str | bool | None:
    """A cron's H resolved for the name: the text; None when it has no H (the table's text
    is then all its findings depend on); False when its H is malformed (an error)."""
    if type(cron) is not str or ("H" not in cron and "h" not in cron) or not uses_hash(cron):
        return None
    try:
        return resolve(cron, name)
    except TimingError:
        return False


@functools.lru_cache(maxsize=1 << 17)  # generated sets hold tens of thousands of distinct crons
def _plain_cron_check(expr: str) -> tuple[str | None, tuple[str, ...], str]:
    return (*_cron_check(expr, v.shown(expr)), expr)


@functools.lru_cache(maxsize=1 << 17)
def _cron_check(expr: str, shown: str) -> tuple[str | None, tuple[str, ...]]:
    try:
        parsed = parse_cron(expr)
    except TimingError as exc:
        return f"cron {shown}: {exc}", ()
    if parsed.never_fires():
        return f"cron {shown} can never fire (no date matches it)", ()
    return None, tuple(f"cron {shown}: {message}" for message in parsed.warnings)


@functools.lru_cache(maxsize=1024)
def zone_check(name: str) -> tuple[str | None, str | None]:
    """(error message, canonical name if ``name`` is a deprecated alias)."""
    try:
        load_zone(name)
    except TimingError as exc:
        return str(exc), None
    return None, deprecated_zone_alias(name)


@functools.lru_cache(maxsize=1 << 17)
def dst_warnings(
    cron: str | None, every: float | None, timezone: str, now: datetime
) -> tuple[str, ...]:
    """What DST does to a fixed-time cron in the coming year (nothing for ``every``); a cron
    with ``H`` is given resolved (:func:`cron_check`), its hashed times being fixed ones."""
    if cron is None:
        return ()
    try:
        expr = parse_cron(cron)  # cached: the hours and fixed_time, without a trigger
        if not expr.fixed_time:
            return ()
        touched = dst_hours(timezone, now)
        if not touched or touched.isdisjoint(expr.hours):
            return ()  # no offset change in the coming year touches an hour this cron names
        trigger = make_trigger(cron=cron, every=every, timezone=timezone)
    except TimingError:  # already reported by the checks of cron and timezone
        return ()
    return tuple(a.message for a in dst_anomalies(trigger, now, now + DST_HORIZON))


@functools.lru_cache(maxsize=512)
def dst_hours(timezone: str, now: datetime) -> frozenset[int]:
    """Local hours of the day that a gap skips or a fold repeats in the coming year: a cheap
    filter before the exact (and slower) ``dst_anomalies``."""
    zone = load_zone(timezone)
    start = int(now.timestamp())
    end = start + int(DST_HORIZON.total_seconds())
    hours: set[int] = set()
    for instant, before, after in zones.transitions(zone, start - 86400, end + 86400):
        first, last = sorted((instant + before, instant + after))  # local seconds it affects
        hours.update(h % 24 for h in range(first // 3600, (last - 1) // 3600 + 1))
    return frozenset(hours)


@functools.lru_cache(maxsize=1 << 17)
def gap_floor(cron: str) -> float:
    """A lower bound of the time between two fires, from the fields alone: fires that share
    their second of the minute are at least a minute apart, of the hour an hour, of the day a
    day (in UTC, where :func:`shortest_gap` measures). A timeout within it needs no search."""
    expr = parse_cron(cron)
    if len(expr.seconds) != 1:
        return 1.0
    if len(expr.minutes) != 1:
        return 60.0
    return 3600.0 if len(expr.hours) != 1 else 86400.0


@functools.lru_cache(maxsize=1 << 17)
def shortest_gap(cron: str, now: datetime) -> float | None:
    """The shortest time between consecutive fires among the next few (None: fewer than two).

    Measured in UTC: the nominal interval of the expression, the same in every zone (a DST
    change lengthens or shortens one gap a year; that is not what this warning is about).
    """
    try:
        trigger = make_trigger(cron=cron, every=None, timezone="UTC")
    except TimingError:
        return None
    fires = list(itertools.islice(trigger.fires(now, now + INTERVAL_HORIZON), INTERVAL_FIRES))
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(fires)]
    return min(gaps) if gaps else None


def fmt_interval(seconds: float) -> str:
    if seconds % 86400 == 0:
        return f"{seconds / 86400:g}d"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
