"""What the audit (``cronkeeper.audit``) is fed, read from rows: stored versions, recorded
periods, the ``--since`` a user gave, and the length of a schedule's period. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from cronkeeper.schedule.model import ScheduleSpec, read_stored_version
from cronkeeper.timing import TimingError, Trigger, parse_duration, parse_instant


@dataclass(frozen=True, slots=True)
class Version:
    """One row of ``schedule_versions``: ``spec`` None means removed at ``active_from``."""

    schedule: str
    version_id: int
    spec: ScheduleSpec | None
    active_from: datetime


def period_seconds(spec: ScheduleSpec, around: datetime, trigger: Trigger | None = None) -> float | None:
    """The length of the schedule's period around an instant (next fire - the one before)."""
    trig = trigger or spec.trigger()
    first = trig.next_fire(around)
    if first is None:
        return None
    second = trig.next_fire(first)
    return None if second is None else (second - first).total_seconds()


def versions_from_rows(rows: Iterable[tuple]) -> dict[str, list[Version]]:
    """(id, schedule, spec json or None, active_from) rows, ordered by schedule and
    active_from, -> versions by schedule. UnreadableVersion names a row that cannot be read."""
    out: dict[str, list[Version]] = {}
    for version_id, schedule, spec_json, active_from in rows:
        spec = None
        if spec_json is not None:
            spec, _ = read_stored_version(schedule, version_id, spec_json)
        out.setdefault(schedule, []).append(Version(schedule, version_id, spec, active_from))
    return out


def records_from_rows(rows: Iterable[tuple]) -> list[tuple]:
    """Rows shaped like ``Record`` (plain tuples will do), ascending by instant -> one per
    instant (a period joined to two jobs keeps the first)."""
    out: list[tuple] = []
    append = out.append
    last = None
    for row in rows:
        if row[0] != last:
            append(row)
            last = row[0]
    return out


def parse_since(value: str, now: datetime) -> datetime:
    """``24h``, ``90m``, ``7d`` (a duration back from now) or an ISO 8601 instant with offset.
    Raises ValueError with a message for the user."""
    text = value.strip()
    if text[:1].isdigit() and ("-" in text or ":" in text):
        return parse_instant(text)
    try:
        return now - timedelta(seconds=parse_duration(text))
    except TimingError as exc:
        raise ValueError(f"{exc}; or give an ISO 8601 instant such as 2026-03-08T07:00:00Z") from None
    except OverflowError:
        raise ValueError(f"--since {text!r} reaches back before year 1") from None
