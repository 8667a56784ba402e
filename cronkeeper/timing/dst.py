"""What DST does to a fixed-time cron: each named local time that a gap skips or a fold repeats,
and the one instant it fires instead (docs/schedules.md). For ``cronkeeper validate`` and ``explain``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from cronkeeper.timing import zones
from cronkeeper.timing.triggers import DAY, CronTrigger, Trigger, to_datetime, to_seconds


class AnomalyKind(StrEnum):
    GAP = "gap"
    FOLD = "fold"


@dataclass(frozen=True, slots=True)
class DstAnomaly:
    local: datetime  # naive wall time the cron names
    kind: AnomalyKind
    fires_at: datetime  # aware UTC: the one fire it gets
    message: str


def _clock(when: datetime, seconds: bool) -> str:
    return when.strftime("%H:%M:%S" if seconds else "%H:%M")


def _message(trigger: CronTrigger, local: datetime, kind: AnomalyKind, fires_at: datetime) -> str:
    seconds = trigger.expr.has_seconds
    wall = fires_at.astimezone(trigger.zone)
    at = _clock(wall, seconds)
    if wall.date() != local.date():
        at = f"{wall.date().isoformat()} {at}"
    at = f"{at} {wall.tzname()} ({_clock(fires_at, seconds)}Z)"
    named = f"{local.date().isoformat()} {_clock(local, seconds)}"
    if kind is AnomalyKind.GAP:
        return f"{named} does not exist in {trigger.timezone} (DST gap); it fires once at {at}"
    return (
        f"{named} occurs twice in {trigger.timezone} (DST fold); it fires once, "
        f"at its first occurrence, {at}"
    )


def dst_anomalies(trigger: Trigger, start: datetime, end: datetime) -> list[DstAnomaly]:
    """Gap and fold anomalies of a fixed-time cron trigger whose fire falls in
    ``start < fires_at <= end`` (empty for elapsed-time crons and ``every``)."""
    lo, hi = to_seconds(start, "start"), to_seconds(end, "end")
    if not isinstance(trigger, CronTrigger) or not trigger.fixed_time:
        return []
    out: list[DstAnomaly] = []
    for instant, before, after in zones.transitions(trigger.zone, lo - DAY, hi + DAY + 1):
        if after > before:  # gap: local [instant+before, instant+after) never occurs
            kind, first, last = AnomalyKind.GAP, instant + before, instant + after
        else:  # fold: local [instant+after, instant+before) occurs twice; first at L - before
            kind, first, last = AnomalyKind.FOLD, instant + after, instant + before
        for chunk in trigger.local_matches(first, last):
            for local_seconds in chunk:
                fire = instant if kind is AnomalyKind.GAP else local_seconds - before
                if not lo < fire <= hi:
                    continue
                local = datetime(1970, 1, 1) + timedelta(seconds=local_seconds)
                fires_at = to_datetime(fire)
                out.append(
                    DstAnomaly(local, kind, fires_at, _message(trigger, local, kind, fires_at))
                )
    return out
