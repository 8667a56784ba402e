"""The missed-run audit (§9): the periods each schedule's versions imply, joined with what was
recorded. Pure: versions, records, the window and ``now`` are all arguments.

    audit(versions, records, since=..., until=..., now=...) -> Audit(rows, summary, notes)

- A version is in force over ``(active_from, next version's active_from]``: its first period is
  strictly after its ``active_from`` (the scheduler adopts a version at an instant and fires by it
  from then on), and a period at the very instant the next version starts was due under the old
  one. A version whose spec is ``None`` records the schedule's removal: nothing is expected.
- Each expected period, merged with its recorded outcome (and job), gets a status:
  ``emitted`` (lag = emitted_at - scheduled_for), ``skipped`` (with the recorded reason),
  ``pending`` (no outcome yet, due at most ``grace`` ago) or ``missing`` (no outcome, due more
  than ``grace`` ago: the case the audit exists for). A period without an outcome on a date the
  version's calendar lists is ``skipped`` (reason ``calendar``): it was never to fire (the
  planner's rule, ``planning.on_listed_date``), so a leader that was away then lost nothing.
- A recorded outcome that no version implies (a backfill, or a row written by hand) is listed
  with its recorded status too: the audit hides nothing that was recorded.
- Periods decided before the retention horizon are pruned (default 400 days): the window is cut
  at the horizon, and a note says so, rather than reporting pruned periods as missing.

What it is fed (versions and records read from rows, ``--since``, a period's length) is
``audit_inputs``; instants as text, ``instants``: both re-exported here.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

from cronkeeper.audit_inputs import Version as Version
from cronkeeper.audit_inputs import parse_since as parse_since
from cronkeeper.audit_inputs import period_seconds as period_seconds
from cronkeeper.audit_inputs import records_from_rows as records_from_rows
from cronkeeper.audit_inputs import versions_from_rows as versions_from_rows
from cronkeeper.instants import iso as iso
from cronkeeper.instants import iso_second as iso_second
from cronkeeper.instants import iso_unix as iso_unix
from cronkeeper.instants import unix as unix
from cronkeeper.planning import Reason, listed_test
from cronkeeper.schedule.model import ScheduleSpec
from cronkeeper.timing import Trigger

DEFAULT_RETENTION_DAYS = 400.0
_TINY = timedelta(microseconds=1)


class Status(StrEnum):
    EMITTED = "emitted"
    SKIPPED = "skipped"
    PENDING = "pending"
    MISSING = "missing"


def specs_in_force(versions: Mapping[str, Sequence[Version]]) -> dict[str, ScheduleSpec]:
    """Each schedule's spec in force: its newest version's, unless that version removed it."""
    return {name: spec for name, vs in versions.items() if (spec := vs[-1].spec) is not None}


def spec_in_force(version: Version) -> ScheduleSpec:
    """The spec of a version in force (a removal's version is never in force)."""
    if version.spec is None:
        raise ValueError(f"version {version.version_id} removed schedule {version.schedule!r}")
    return version.spec


class Record(NamedTuple):
    """A recorded outcome of one period, with its job when one was emitted (and not pruned).
    Instants are Unix seconds: a year of periods is half a million of these, so they stay
    cheap tuples; ``Record.of`` builds one from datetimes."""

    at: int  # scheduled_for
    outcome: str  # emitted | skipped
    reason: str | None
    emitted_at: float | None = None  # the job's created_at, else the decision's decided_at
    job_state: str | None = None
    attempts: int | None = None

    @classmethod
    def of(cls, scheduled_for: datetime, outcome: str, reason: str | None = None,
           emitted_at: datetime | None = None, job_state: str | None = None,
           attempts: int | None = None) -> Record:
        return cls(unix(scheduled_for), outcome, reason,
                   None if emitted_at is None else emitted_at.timestamp(), job_state, attempts)


class HistoryRow(NamedTuple):
    """One period of the audit, in the field order of ``history --format json``."""

    schedule: str
    scheduled_for: str
    status: str
    reason: str | None = None
    emitted_at: str | None = None
    lag_seconds: float | None = None
    job_state: str | None = None
    attempts: int | None = None


FIELDS = HistoryRow._fields


@dataclass(slots=True)
class Summary:
    schedule: str
    owner: str | None = None
    emitted: int = 0
    skipped: int = 0
    pending: int = 0
    missing: int = 0
    dead: int = 0


@dataclass(slots=True)
class Audit:
    rows: list[HistoryRow] = field(default_factory=list)
    summary: list[Summary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return sum(s.missing for s in self.summary)

    @property
    def dead(self) -> int:
        return sum(s.dead for s in self.summary)


@dataclass(frozen=True, slots=True)
class Window:
    since: datetime
    until: datetime
    now: datetime
    retention_days: float = DEFAULT_RETENTION_DAYS

    def clipped(self) -> tuple[datetime, datetime, str | None]:
        """(since, until) cut to the retention horizon and to ``now``; a note when cut."""
        horizon = self.now - timedelta(days=self.retention_days)
        until = min(self.until, self.now)
        if self.since < horizon:
            note = (
                f"the window starts before the retention horizon ({iso(horizon)}, "
                f"{self.retention_days:g} days of periods are kept): earlier periods are pruned "
                "and not audited"
            )
            return horizon, until, note
        return self.since, until, None


def spans(
    versions: Sequence[Version], since: datetime, until: datetime, triggers: dict | None = None
) -> Iterator[tuple[ScheduleSpec, Trigger, datetime, datetime]]:
    """(spec, trigger, after, upto) for each version in force during the window: its periods
    are the trigger's fires with ``after < t <= upto``."""
    for version, trigger, after, upto in version_spans(versions, since, until, triggers):
        yield version.spec, trigger, after, upto  # type: ignore[misc]


def version_spans(
    versions: Sequence[Version], since: datetime, until: datetime, triggers: dict | None = None
) -> Iterator[tuple[Version, Trigger, datetime, datetime]]:
    """``spans`` with the version itself (its id keys caches of its fires)."""
    cache = triggers if triggers is not None else {}
    for i, version in enumerate(versions):
        if version.spec is None:
            continue
        end = versions[i + 1].active_from if i + 1 < len(versions) else None
        upto = until if end is None else min(until, end)
        after = max(version.active_from, since - _TINY)
        if after >= upto:
            continue
        trigger = cache.get(version.version_id)
        if trigger is None:
            trigger = cache[version.version_id] = version.spec.trigger()
        yield version, trigger, after, upto


# (version id, trigger, after, upto) -> the fires in (after, upto] as whole Unix seconds,
# ascending: ``fire_seconds`` by default; a long-running reader may pass a cache of them.
FireSource = Callable[[int, Trigger, datetime, datetime], Iterable[int]]


def uncached_fires(_version_id: int, trigger: Trigger, after: datetime, upto: datetime
              ) -> Iterator[int]:
    return fire_seconds(trigger, after, upto)


def expected(
    versions: Sequence[Version], since: datetime, until: datetime, triggers: dict | None = None
) -> Iterator[tuple[datetime, ScheduleSpec]]:
    """Every period ``since <= t <= until`` implied by one schedule's versions (sorted by
    ``active_from``), with the spec in force for it, ascending."""
    for spec, trigger, after, upto in spans(versions, since, until, triggers):
        for t in trigger.fires(after, upto):
            yield t, spec


def fire_seconds(trigger: Trigger, after: datetime, upto: datetime) -> Iterator[int]:
    """``trigger.fires(after, upto)`` as whole Unix seconds, read from the trigger's chunks of
    seconds without building a datetime per period (a year of a minutely schedule is 525,600
    of them). Same instants as ``fires``: the test suite compares the two."""
    chunks = getattr(trigger, "_chunks", None)
    if chunks is None:  # a trigger without chunks: the public API
        for t in trigger.fires(after, upto):
            yield math.floor(t.timestamp())
        return
    start, end = math.floor(after.timestamp()) + 1, math.floor(upto.timestamp())
    if start > end:
        return
    for chunk in chunks(start):
        if chunk[-1] > end:
            yield from chunk[: bisect_right(chunk, end)]
            return
        yield from chunk


def audit_schedule(
    schedule: str,
    versions: Sequence[Version],
    records: Iterable[Record | tuple[Any, ...]],
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    triggers: dict | None = None,
    fires: FireSource | None = None,
) -> tuple[list[HistoryRow], Summary]:
    """Merge one schedule's expected periods with its records (both ascending by instant, one
    record per instant), up to ``min(until, now)``: nothing later is due. Written for speed:
    a year of a minutely schedule is 525,600 rows. ``fires`` computes each version's fires
    (default ``fire_seconds``; the web passes its cache of them)."""
    until = min(until, now)
    owner = next((v.spec.owner for v in reversed(versions) if v.spec is not None), None)
    rows: list[HistoryRow] = []
    append = rows.append
    recs = iter(records)
    rec = next(recs, None)
    now_s = now.timestamp()
    lo, hi = unix(since), unix(until)
    row, fmt = HistoryRow, iso_second
    emitted, skipped = Status.EMITTED.value, Status.SKIPPED.value
    pending, missing = Status.PENDING.value, Status.MISSING.value
    calendar = Reason.CALENDAR.value
    source = fires or uncached_fires
    for version, trigger, after, upto in version_spans(versions, since, until, triggers):
        grace = version.spec.grace  # type: ignore[union-attr]
        listed = listed_test(version.spec)  # type: ignore[arg-type]
        for at in source(version.version_id, trigger, after, upto):
            while rec is not None and rec[0] <= at:
                r_at, outcome, reason, emitted_at, state, attempts = rec
                if outcome == emitted:
                    if emitted_at is None:
                        append(row(schedule, fmt(r_at), emitted, reason, None, None, state,
                                   attempts))
                    else:
                        append(row(schedule, fmt(r_at), emitted, reason, iso_unix(emitted_at),
                                   round(emitted_at - r_at, 3), state, attempts))
                else:
                    append(row(schedule, fmt(r_at), skipped, reason, None, None, state, attempts))
                rec = next(recs, None)
                if r_at == at:
                    break
            else:
                if listed is not None and listed(at):
                    append(row(schedule, fmt(at), skipped, calendar))
                else:
                    append(row(schedule, fmt(at), pending if now_s - at <= grace else missing))
    while rec is not None:
        if lo <= rec[0] <= hi:
            append(_recorded(schedule, rec))
        rec = next(recs, None)
    return rows, summarize(schedule, owner, rows)


def _recorded(schedule: str, rec: Record | tuple) -> HistoryRow:
    at, outcome, reason, emitted_at, state, attempts = rec
    if outcome != Status.EMITTED.value:
        return HistoryRow(schedule, iso_second(at), Status.SKIPPED.value, reason, None, None,
                          state, attempts)
    if emitted_at is None:
        return HistoryRow(schedule, iso_second(at), outcome, reason, None, None, state, attempts)
    return HistoryRow(schedule, iso_second(at), outcome, reason, iso_unix(emitted_at),
                      round(emitted_at - at, 3), state, attempts)


def summarize(schedule: str, owner: str | None, rows: Iterable[HistoryRow]) -> Summary:
    counts = {s.value: 0 for s in Status}
    dead = 0
    for row in rows:
        counts[row[2]] += 1
        if row[6] == "dead":
            dead += 1
    return Summary(schedule, owner, counts["emitted"], counts["skipped"], counts["pending"],
                   counts["missing"], dead)


def audit(
    versions: Mapping[str, Sequence[Version]],
    records: Mapping[str, Iterable[Record | tuple[Any, ...]]],
    window: Window,
) -> Audit:
    """The whole audit: rows schedule by schedule (names sorted), a summary for each."""
    since, until, note = window.clipped()
    result = Audit()
    if note:
        result.notes.append(note)
    for name in sorted(versions):
        rows, summary = audit_schedule(
            name, versions[name], records.get(name, ()), since=since, until=until,
            now=window.now,
        )
        result.rows.extend(rows)
        result.summary.append(summary)
    return result


def in_window(versions: Sequence[Version], since: datetime, until: datetime) -> bool:
    """True when some version of the schedule was in force during ``[since, until]``."""
    for i, version in enumerate(versions):
        if version.spec is None:
            continue
        end = versions[i + 1].active_from if i + 1 < len(versions) else None
        if version.active_from < until and (end is None or end >= since):
            return True
    return False
