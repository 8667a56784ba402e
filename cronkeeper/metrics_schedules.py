"""The per-schedule families of the metrics (``metrics.DatabaseCollector`` scrapes them): last
and next fire, the run-time figures (p99, timeout, timed out in 24 hours) and the periods missing
in the last hour.

While a leader leads, the run-time figures, the missing counts and (on a first scrape) the next
fires come from its summary (``db.schedule_summaries``, written by ``cronkeeper.summarizer``:
the audit ``status`` and the ``missing`` notification use), for every schedule whose row is at
most ``summary.STALE_AFTER`` old and of the version in force. The other schedules are
computed here as before: the run-time statement at most every ``RUNTIMES_EVERY`` seconds, and
the audit of the last hour in a thread of its own at most every ``AUDIT_EVERY`` seconds, never
inside a scrape (it also logs each newly missing period, as the summarizer does).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cronkeeper import clock
from cronkeeper.summary import missing_at, next_fire_after

log = logging.getLogger("cronkeeper.metrics")

AUDIT_WINDOW = timedelta(hours=1)
AUDIT_EVERY = 60.0  # seconds from the end of one audit of the last hour to the next
AUDIT_CHUNK = 1_000  # schedules whose periods one audit statement reads
RUNTIMES_EVERY = 60.0  # seconds a scrape reuses the run-time figures (one statement, ~0.2 ms a schedule)


class _Current(NamedTuple):
    """What a scrape keeps of a schedule in force."""

    version_id: int
    owner: str
    active_from: datetime
    trigger: Any
    timeout: float
    source: str = "file"  # or "runtime" (cronkeeper.schedules)


class MissingFamily(Collector):
    """The periods missing in the last hour of the schedules the leader's summary does not
    cover: the audit, in a thread of its own (``_audit``), and its family."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._audit_at = -1e18
        self._auditing = False
        self._audit_names: list[str] | None = None  # the schedules the next audit covers
        self.audited = threading.Event()  # set once an audit has finished: counts are known
        self.audits = 0  # audits finished: a read older than the last one lacks its counts
        self._missing: dict[tuple[str, str], int] = {}
        self._logged: set[tuple[str, str]] = set()
        self._warned: set[str] = set()

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("metrics: %s", message, extra={"action": "metrics_version_unreadable"})

    def _missing_family(self, current: dict[str, _Current], rows: dict[str, Any],
                        now: datetime) -> GaugeMetricFamily:
        """The missing counts: the leader's summary's, and for the schedules it does not
        cover the last audit's. That audit runs in a thread of its own, at most every
        AUDIT_EVERY seconds after the previous one ended, never inside a scrape: at 10,000
        schedules it takes longer than Prometheus waits for a scrape. Until it has finished
        those schedules' counts are absent (unknown), never a reassuring 0."""
        rest = sorted(current.keys() - rows.keys())
        with self._lock:
            if rest and not self._auditing and clock.monotonic() - self._audit_at >= AUDIT_EVERY:
                self._auditing, self._audit_names = True, rest
                threading.Thread(target=self._audit, daemon=True, name="metrics-audit").start()
            found, audited = dict(self._missing), self.audited.is_set()
        family = GaugeMetricFamily("cronkeeper_periods_missing", "Periods of the last hour due "
                                   "beyond grace with no recorded outcome (the history audit).",
                                   labels=["schedule", "owner"])
        counts: dict[tuple[str, str], int] = {}
        for name in rest:  # in force, not in the audited window: 0
            owner = current[name].owner
            if (name, owner) in found or audited:
                counts[(name, owner)] = found.get((name, owner), 0)
        for name, row in rows.items():  # (a row that cannot count at now says its own hour's)
            known, n = missing_at(row, now)
            counts[(name, current[name].owner)] = n if known else row.missing_last_hour or 0
        for key, n in found.items():  # audited, since removed
            if key[0] not in current:
                counts[key] = n
        for (name, owner), n in sorted(counts.items()):
            family.add_metric([name, owner], n)
        return family

    def _audit(self) -> None:
        """Audit the last hour of the schedules the summary does not cover (``history``'s
        rules), AUDIT_CHUNK schedules at a time (their versions parsed, their periods read in
        one statement, then let go), and log each newly missing period at warning."""
        from itertools import groupby

        from cronkeeper.audit import Status, audit_schedule, in_window, records_from_rows
        from cronkeeper.audit import versions_from_rows as parse
        from cronkeeper.db.periods import periods_windows
        from cronkeeper.db.schedule_versions import versions_all, versions_in_force
        from cronkeeper.db.sessions import session_utc

        missing: dict[tuple[str, str], int] = {}
        try:
            with self.engine.connect() as conn:
                now = session_utc(conn)
                since = now - AUDIT_WINDOW
                names = self._audit_names
                if names is None:
                    names = [row.schedule for row in versions_in_force(conn)]
                for i in range(0, len(names), AUDIT_CHUNK):
                    versions = {}
                    for name, group in groupby(versions_all(conn, names[i:i + AUDIT_CHUNK]),
                                               key=lambda row: row[1]):
                        try:
                            vs = parse(group)[name]
                        except ValueError as exc:  # that schedule only, warned once
                            self._warn_once(str(exc))
                            continue
                        if in_window(vs, since, now):
                            versions[name] = vs
                    rows_of = periods_windows(conn, [(n, since) for n in versions], now)
                    for name, vs in versions.items():
                        rows, summary = audit_schedule(
                            name, vs, records_from_rows(rows_of[name]), since=since, until=now,
                            now=now)  # fmt: skip
                        missing[(name, summary.owner or "")] = summary.missing
                        if summary.missing:
                            self._log_missing(name, summary.owner, rows, Status.MISSING)
                conn.rollback()
        except Exception as exc:  # noqa: BLE001 - the next attempt comes AUDIT_EVERY later
            log.warning("metrics: audit of the last hour failed: %s: %s", type(exc).__name__, exc,
                        extra={"action": "metrics_audit_failed"})
            with self._lock:
                self._auditing, self._audit_at = False, clock.monotonic()
            return
        with self._lock:
            self._missing = missing
            self._auditing, self._audit_at = False, clock.monotonic()
            self.audits += 1
            if len(self._logged) > 100_000:
                self._logged.clear()
        self.audited.set()

    def _log_missing(self, name: str, owner: str | None, rows: list, status: Any) -> None:
        for row in rows:
            key = (name, row.scheduled_for)
            if row.status == status and key not in self._logged:
                self._logged.add(key)
                log.warning(
                    "period missing: %s due at %s has no recorded outcome", name,
                    row.scheduled_for,
                    extra={"action": "period_missing", "schedule": name,
                           "scheduled_for": row.scheduled_for, "owner": owner},
                )


class ScheduleFamilies(MissingFamily):
    """The per-schedule families, for a collector that reads the database on each scrape."""

    def __init__(self, engine: Any, cluster: str, *, audit: bool = True) -> None:
        super().__init__(engine)
        self.cluster = cluster
        self.audit = audit
        self._versions_stamp: tuple[int, int] | None = None
        self._current: dict[str, _Current] = {}
        self._next: dict[str, tuple[datetime, int, datetime | None]] = {}
        self._runtimes: dict[str, tuple[int, float | None, float | None, int]] = {}
        self._runtimes_at = -1e18

    def _schedules(self, conn: Any, now: datetime) -> list:
        from cronkeeper.db.periods import periods_last_emitted, periods_latest

        current = self._current_cached(conn)
        rows = self._summaries(conn, current)
        last = periods_latest(conn, list(current))
        emitted = periods_last_emitted(conn, list(current))
        last_fire = GaugeMetricFamily("cronkeeper_schedule_last_fire_timestamp_seconds",
                                      "Nominal instant of the schedule's latest emitted period.",
                                      labels=["schedule", "owner"])
        next_fire = GaugeMetricFamily(
            "cronkeeper_schedule_next_fire_timestamp_seconds",
            "Nominal instant of the schedule's next undecided period (in the past: overdue, no "
            "leader is deciding).", labels=["schedule", "owner"])

        source = GaugeMetricFamily(
            "cronkeeper_schedule_info", "1 for each schedule in force; `source` says where it "
            "is defined: file, or runtime (cronkeeper.schedules).",
            labels=["schedule", "owner", "source"])
        known = self._next
        for name, (version_id, owner, active_from, trigger, _, origin) in current.items():
            source.add_metric([name, owner, origin], 1)
            if name in emitted:
                last_fire.add_metric([name, owner], emitted[name].timestamp())
            after = max(active_from, last[name][0]) if name in last else active_from
            cached = known.get(name)
            row = rows.get(name)
            if cached is not None and cached[0] == after and cached[1] == version_id:
                upcoming = cached[2]  # nothing decided since the last scrape: same next fire
            elif row is not None and next_fire_after(row, after)[0]:
                upcoming = next_fire_after(row, after)[1]  # as the leader's summary lists it
                known[name] = (after, version_id, upcoming)
            else:
                upcoming = trigger.next_fire(after)
                known[name] = (after, version_id, upcoming)
            if upcoming is not None:
                next_fire.add_metric([name, owner], upcoming.timestamp())
        summarized = GaugeMetricFamily(
            "cronkeeper_schedule_summary_age_seconds", "Age of the oldest of the leader's "
            "summary rows this scrape's per-schedule figures came from (no sample: none, every "
            "figure computed by the scraped process).")
        if rows:
            summarized.add_metric([], max(0.0, max(r.age_seconds for r in rows.values())))
        families = [last_fire, next_fire, source, summarized,
                    *self._runtime_families(conn, current, rows)]
        if self.audit:
            families.append(self._missing_family(current, rows, now))
        return families

    def _summaries(self, conn: Any, current: dict[str, _Current]) -> dict[str, Any]:
        """The leader's summary rows usable for the schedules in force ({} without a leader)."""
        from cronkeeper.db.leadership import leadership_current
        from cronkeeper.db.schedule_summaries import summaries_read
        from cronkeeper.operations.leadership import leads
        from cronkeeper.summary import usable

        if not leads(leadership_current(conn, self.cluster)):
            return {}
        return usable(summaries_read(conn), {n: c.version_id for n, c in current.items()})

    def _runtime_families(self, conn: Any, current: dict[str, _Current],
                          rows: dict[str, Any]) -> list:
        """docs/observability.md, timeouts matched to the work: the p99 run time of each
        schedule's last 100 finished attempts (a timed-out one counted at its timeout; no series
        before one has finished), its timeout, and its attempts that timed out in the last 24
        hours: the figures of ``status``, from the leader's summary or from its statement, read
        again at most every RUNTIMES_EVERY."""
        from cronkeeper.db.attempts import attempts_runtimes
        from cronkeeper.runtimes import SAMPLE

        rest = sorted(current.keys() - rows.keys())
        if rest and clock.monotonic() - self._runtimes_at >= RUNTIMES_EVERY:
            self._runtimes = attempts_runtimes(conn, rest, SAMPLE)
            self._runtimes_at = clock.monotonic()
        figures = dict(self._runtimes)
        figures.update((n, (r.duration_attempts, r.duration_p50_seconds, r.duration_p99_seconds,
                            r.attempts_timed_out_24h)) for n, r in rows.items())
        p99 = GaugeMetricFamily("cronkeeper_schedule_duration_p99_seconds", "p99 run time of the "
                                "schedule's last 100 finished attempts (a timed-out attempt "
                                "counts at its timeout).", labels=["schedule", "owner"])
        timeout = GaugeMetricFamily("cronkeeper_schedule_timeout_seconds", "The schedule's "
                                    "timeout (its version in force).", labels=["schedule", "owner"])
        timed_out = GaugeMetricFamily("cronkeeper_schedule_attempts_timed_out_24h", "Attempts of "
                                      "the schedule that timed out in the last 24 hours.",
                                      labels=["schedule", "owner"])
        for name, entry in current.items():
            found = figures.get(name)
            timeout.add_metric([name, entry.owner], entry.timeout)
            timed_out.add_metric([name, entry.owner], found[3] if found else 0)
            if found is not None and found[2] is not None:
                p99.add_metric([name, entry.owner], found[2])
        return [p99, timeout, timed_out]

    def _current_cached(self, conn: Any) -> dict[str, _Current]:
        """Each schedule in force: (version id, owner, active_from, trigger), read again only
        when a version was recorded since (versions are only appended). Parsing every stored
        spec was most of a scrape's cost; this keeps about 200 B per schedule (triggers are
        shared), not the parsed specs (1.4 KiB each)."""
        from cronkeeper.db.schedule_versions import versions_in_force, versions_stamp
        from cronkeeper.schedule.model import read_stored_version

        stamp = versions_stamp(conn)
        with self._lock:
            if stamp == self._versions_stamp:
                return self._current
        current: dict[str, _Current] = {}
        for row in versions_in_force(conn):
            version_id, name, data, active_from = row.id, row.schedule, row.spec, row.active_from
            if data is None:
                continue  # removed
            try:
                spec, trigger = read_stored_version(name, version_id, data)
            except ValueError as exc:  # a row someone else wrote: that schedule only
                self._warn_once(str(exc))
                continue
            current[name] = _Current(version_id, sys.intern(spec.owner or ""), active_from, trigger,
                                     spec.timeout,
                                     "runtime" if row.origin == "runtime" else "file")
        with self._lock:
            self._current, self._versions_stamp = current, stamp
            self._next = {n: v for n, v in self._next.items() if n in current}
        return current

    def describe(self) -> Iterable:
        return []  # collected lazily: never query the database at registration
