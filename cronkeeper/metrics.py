"""Every metric cronkeeper exports, declared in one place, on an injectable registry (§8).

Two sources:
- this process's own events: leadership and term, fires and fire lag (the leader's ticks),
  clock skew, and the worker's job events (``job_started`` / ``job_finished``);
- the database, read on each scrape by ``DatabaseCollector`` so that every instance reports the
  same truth: outbox depth by state, age of the oldest ready job, dead letters, jobs waiting to
  retry, attempts started (fleet-wide), live instances, schedule digest and tzdata disagreement,
  last and next fire per schedule, and periods missing in the last hour (the audit, run in a
  thread of its own about once a minute, never inside a scrape; newly missing periods are also
  logged at warning); and each schedule's p99 run time, timeout and timed-out attempts of the
  last 24 hours (``status``'s figures, read again at most once a minute).

Labels are bounded: schedule, owner, outcome, reason, state, kind. Never job ids or error text.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cronkeeper import __version__, clock
from cronkeeper.outage import OutageReport
from cronkeeper.timing import tzdata_version

log = logging.getLogger("cronkeeper.metrics")

LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 20)
FAILED = frozenset({"retry", "timeout", "lease_expired", "dead", "failed"})
AUDIT_WINDOW = timedelta(hours=1)
AUDIT_EVERY = 60.0  # seconds from the end of one audit of the last hour to the next
AUDIT_CHUNK = 1_000  # schedules whose periods one audit statement reads
RUNTIMES_EVERY = 60.0  # seconds a scrape reuses the run-time figures (one statement, ~0.2 ms a schedule)


class Metrics:
    """The metrics of one process. ``kind`` is ``scheduler`` or ``worker``."""

    def __init__(self, registry: CollectorRegistry | None = None, *, kind: str = "scheduler") -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.kind = kind
        r = self.registry
        self.info = Gauge("cronkeeper_build_info", "Always 1: this process's version, kind and "
                          "IANA tzdata version.", ["version", "kind", "tzdata"], registry=r)
        self.info.labels(__version__, kind, tzdata_version()).set(1)
        # leadership (set by election.Node)
        self.leader = Gauge("cronkeeper_leader", "1 while this instance is the cluster's leader.",
                            registry=r)
        self.term = Gauge("cronkeeper_leader_term", "The term (fencing token) this instance last "
                          "led or saw.", registry=r)
        self.skew = Gauge("cronkeeper_clock_skew_seconds", "Database clock minus this host's "
                          "clock, at the last instance heartbeat.", registry=r)
        # the leader's decisions
        self.fires = _FireCounts()
        r.register(self.fires)
        # Histograms carry no schedule label: 16 series per schedule would be about 4 KiB of
        # daemon memory per schedule (440 MiB at 100,000) and a scrape of millions of lines.
        # Per-schedule detail is in the counters, the gauges and `history`.
        self.fire_lag = Histogram("cronkeeper_fire_lag_seconds", "Decision time minus the "
                                  "period's nominal instant, for emitted periods, by owner.",
                                  ["owner"], buckets=LAG_BUCKETS, registry=r)
        # the worker's job events
        self.jobs_started = Counter("cronkeeper_jobs_started", "Job attempts started by this "
                                    "worker.", ["schedule", "owner"], registry=r)
        self.jobs_finished = Counter("cronkeeper_jobs_finished", "Job attempts finished by this "
                                     "worker, by outcome.", ["schedule", "owner", "outcome"],
                                     registry=r)
        self.job_failures = Counter("cronkeeper_job_failures", "Failed job attempts (retry, "
                                    "timeout, lease_expired, dead).",
                                    ["schedule", "owner", "outcome"], registry=r)
        self.job_duration = Histogram("cronkeeper_job_duration_seconds", "Run time of one job "
                                      "attempt, by owner and outcome.", ["owner", "outcome"],
                                      buckets=DURATION_BUCKETS, registry=r)
        self.job_attempts = Histogram("cronkeeper_job_attempts", "Attempts a job took, observed "
                                      "when it finished for good (succeeded or dead).",
                                      buckets=ATTEMPT_BUCKETS, registry=r)
        self.jobs_running = Gauge("cronkeeper_jobs_running", "Jobs this worker is running now.",
                                  registry=r)
        # the relay (docs/relay.md)
        self.relay_published = Counter("cronkeeper_relay_published", "Jobs this relay published "
                                       "and marked published, by target.", ["target"], registry=r)
        self.relay_failures = Counter("cronkeeper_relay_failures", "Failed publish attempts of "
                                      "this relay (refused, unroutable, unconfirmed, broker "
                                      "unreachable), by target.", ["target"], registry=r)
        self.relay_publish_lag = Histogram("cronkeeper_relay_publish_lag_seconds", "From when a "
                                           "job became due (its commit, or its run_after when "
                                           "later) to the broker's acknowledgement.",
                                           buckets=LAG_BUCKETS, registry=r)
        # notifications (docs/notifications.md): what this process's sender delivered
        self.notifications_sent = Counter(
            "cronkeeper_notifications_sent", "Notifications this process delivered, by sink and "
            "event (one per sink that took it).", ["sink", "event"], registry=r)
        self.notifications_failed = Counter(
            "cronkeeper_notifications_failed", "Notifications this process could not deliver to "
            "a sink: refused for good, or still failing once their tries were spent. Logged "
            "(notification_failed), never notified about in turn.", ["sink"], registry=r)
        self.notification_delay = Histogram(
            "cronkeeper_notification_delay_seconds", "From the event's commit to the last sink "
            "taking its notification, by event.", ["event"], buckets=LAG_BUCKETS, registry=r)
        self.heartbeat_pings = Counter(
            "cronkeeper_heartbeat_pings", "heartbeat_url pings this instance sent as leader, by "
            "outcome (ok, failed).", ["outcome"], registry=r)
        self._owners: dict[str, str] = {}
        self._owners_of: object = None  # the schedule set _owners was built from

    # -- election.Node ------------------------------------------------------------------------
    def set_leader(self, is_leader: bool, term: int | None) -> None:
        self.leader.set(1 if is_leader else 0)
        if term is not None:
            self.term.set(term)

    def set_skew(self, seconds: float) -> None:
        self.skew.set(seconds)

    # -- leading.LeaderLoop ----------------------------------------------------------------------
    def observe_tick(self, report: Any, schedules: Any = None,
                     owner_of: Any = None) -> None:
        """Count each decision of a ``scheduler.TickReport``; ``schedules`` (a ScheduleSet)
        gives the owners, ``owner_of(name)`` those of the others (runtime schedules)."""
        if schedules is not None and schedules is not self._owners_of:
            # once per schedule set, not per tick: a tick's cost follows its decisions
            self._owners = {s.name: s.owner or "" for s in schedules.specs}
            self._owners_of = schedules
        now = report.now
        owners = self._owners
        counts: dict[tuple[str, str, str, str], int] = {}
        for schedule, decision, _job_id in report.decisions:
            outcome = str(decision.outcome)
            reason = str(decision.reason) if decision.reason is not None else ""
            owner = owners.get(schedule)
            if owner is None:
                owner = (owner_of(schedule) if owner_of is not None else None) or ""
            key = (schedule, owner, outcome, reason)
            counts[key] = counts.get(key, 0) + 1
            if outcome == "emitted":
                lag = (now - decision.scheduled_for).total_seconds()
                self.fire_lag.labels(owner).observe(max(lag, 0.0))
        self.fires.add(counts)

    # -- the worker ----------------------------------------------------------------------------
    def job_started(self, schedule: str | None, owner: str | None) -> None:
        self.jobs_started.labels(schedule or "", owner or "").inc()
        self.jobs_running.inc()

    def job_finished(
        self, schedule: str | None, owner: str | None, outcome: str, duration_seconds: float,
        attempt: int, final: bool | None = None,
    ) -> None:
        """One attempt ended. ``outcome`` as in the attempts table: succeeded, retry, dead,
        timeout, lease_expired, released. ``final``: the job will not run again (default: the
        outcome is succeeded or dead)."""
        s, o = schedule or "", owner or ""
        self.jobs_running.dec()
        self.jobs_finished.labels(s, o, outcome).inc()
        self.job_duration.labels(o, outcome).observe(max(duration_seconds, 0.0))
        if outcome in FAILED:
            self.job_failures.labels(s, o, outcome).inc()
        if final if final is not None else outcome in ("succeeded", "dead"):
            self.job_attempts.observe(attempt)


    # -- the relay ---------------------------------------------------------------------------
    def relay_published_one(self, target: str, lag_seconds: float) -> None:
        self.relay_published.labels(target).inc()
        self.relay_publish_lag.observe(max(lag_seconds, 0.0))

    def relay_failed(self, target: str) -> None:
        self.relay_failures.labels(target).inc()

    def relay_settled(self, schedule: str | None, attempts: int) -> None:
        """A relayed job is done with as far as cronkeeper runs it (published, or dead): its
        attempts go to the same histogram as a worker's jobs (the fourth of the four numbers)."""
        self.job_attempts.observe(attempts)

    # -- notifications ---------------------------------------------------------------------
    def notification_sent(self, sink: str, event: str) -> None:
        self.notifications_sent.labels(sink, event).inc()

    def notification_failed(self, sink: str) -> None:
        self.notifications_failed.labels(sink).inc()

    def notification_delivered(self, event: str, seconds: float) -> None:
        self.notification_delay.labels(event).observe(max(seconds, 0.0))

    def heartbeat_ping(self, ok: bool) -> None:
        self.heartbeat_pings.labels("ok" if ok else "failed").inc()


class _FireCounts(Collector):
    """``cronkeeper_fires_total{schedule, owner, outcome, reason}`` as plain counts. A
    prometheus_client Counter keeps an object per label set (about 630 B each) and costs about
    8 us the first time a label set is seen: at 100,000 schedules, 63 MiB and 0.8 s of the
    leader's CPU in the first burst. A dict entry is a fraction of both, and a tick adds its
    counts under one lock."""

    NAME = "cronkeeper_fires"
    HELP = "Periods decided by this instance as leader, by outcome (emitted|skipped) and reason."
    LABELS = ("schedule", "owner", "outcome", "reason")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str, str, str], int] = {}

    def add(self, counts: dict[tuple[str, str, str, str], int]) -> None:
        with self._lock:
            mine = self._counts
            for key, n in counts.items():
                mine[key] = mine.get(key, 0) + n

    def describe(self) -> Iterable:
        return [CounterMetricFamily(self.NAME, self.HELP, labels=self.LABELS)]

    def collect(self) -> Iterable:
        family = CounterMetricFamily(self.NAME, self.HELP, labels=self.LABELS)
        with self._lock:
            items = list(self._counts.items())
        for key, n in items:
            family.add_metric(key, n)
        return [family]


class NullMetrics(Metrics):
    """What ``current()`` returns when no metrics are served: every call does nothing."""

    def __init__(self) -> None:  # noqa: D107 - nothing to declare
        self.kind = "none"

    def set_leader(self, is_leader: bool, term: int | None) -> None: ...
    def set_skew(self, seconds: float) -> None: ...
    def observe_tick(self, report: Any, schedules: Any = None, owner_of: Any = None) -> None: ...
    def job_started(self, schedule: str | None, owner: str | None) -> None: ...

    def job_finished(self, schedule, owner, outcome, duration_seconds, attempt, final=None) -> None:
        ...

    def relay_published_one(self, target: str, lag_seconds: float) -> None: ...
    def relay_failed(self, target: str) -> None: ...
    def relay_settled(self, schedule: str | None, attempts: int) -> None: ...
    def notification_sent(self, sink: str, event: str) -> None: ...
    def notification_failed(self, sink: str) -> None: ...
    def notification_delivered(self, event: str, seconds: float) -> None: ...
    def heartbeat_ping(self, ok: bool) -> None: ...


class _Current(NamedTuple):
    """What a scrape keeps of a schedule in force."""

    version_id: int
    owner: str
    active_from: datetime
    trigger: Any
    timeout: float
    source: str = "file"  # or "runtime" (cronkeeper.schedules)


class DatabaseCollector(Collector):
    """Queue and fleet figures read from the database on each scrape (a few index scans)."""

    def __init__(self, engine: Any, cluster: str, *, audit: bool = True,
                 live_within: float = 30.0) -> None:
        self.engine = engine
        self.cluster = cluster
        self.audit = audit
        self.live_within = live_within
        self._lock = threading.Lock()
        self._outage = OutageReport()
        self._audit_at = -1e18
        self._auditing = False
        self.audited = threading.Event()  # set once an audit has finished: counts are known
        self._missing: dict[tuple[str, str], int] = {}
        self._logged: set[tuple[str, str]] = set()
        self._versions_stamp: tuple[int, int] | None = None
        self._current: dict[str, _Current] = {}
        self._next: dict[str, tuple[datetime, int, datetime | None]] = {}
        self._warned: set[str] = set()
        self._runtimes: dict[str, tuple[int, float | None, float | None, int]] = {}
        self._runtimes_at = -1e18

    def describe(self) -> Iterable:
        return []  # collected lazily: never query the database at registration

    def collect(self) -> Iterable:
        from cronkeeper.db.sessions import session_utc

        try:
            with self.engine.connect() as conn:
                now = session_utc(conn)
                families = self._families(conn, now)
                conn.rollback()
        except Exception as exc:  # noqa: BLE001 - a scrape must answer even without a database
            with self._lock:  # said once, then once a minute: scrapes come every few seconds
                notice = self._outage.failed(clock.monotonic(), type(exc).__name__)
            if notice is not None:
                log.warning("metrics: database figures unavailable: %s%s", type(exc).__name__,
                            "" if notice.first else
                            f" (for {notice.lasted:.0f}s, {notice.failures} scrapes)",
                            extra={"action": "metrics_db_unavailable"})
            up = GaugeMetricFamily("cronkeeper_database_up", "1 when the last scrape could read "
                                   "the database.")
            up.add_metric([], 0)
            return [up]
        with self._lock:
            back = self._outage.recovered(clock.monotonic())
        if back is not None:
            log.info("metrics: database figures available again after %.1fs", back.lasted,
                     extra={"action": "metrics_db_available"})
        return families

    def _families(self, conn: Any, now: datetime) -> list:
        from cronkeeper.db import outbox as dbo
        from cronkeeper.db.attempts import attempts_high_water

        up = GaugeMetricFamily("cronkeeper_database_up", "1 when the last scrape could read the "
                               "database.")
        up.add_metric([], 1)
        depth = GaugeMetricFamily("cronkeeper_outbox_jobs", "Jobs in the outbox by state.",
                                  labels=["state"])
        counts = dbo.outbox_depth(conn)
        for state in ("available", "running", "succeeded", "dead", "published"):
            depth.add_metric([state], counts.get(state, 0))
        oldest = GaugeMetricFamily(
            "cronkeeper_outbox_oldest_available_age_seconds",
            "Age of the oldest job ready to run (available, run_after <= now), per schedule.",
            labels=["schedule", "owner"])
        ready = GaugeMetricFamily("cronkeeper_outbox_ready_jobs", "Jobs ready to run now "
                                  "(available, run_after <= now), per schedule.",
                                  labels=["schedule", "owner"])
        for schedule, owner, age, n in dbo.outbox_oldest_available(conn):
            oldest.add_metric([schedule, owner], max(age, 0.0))
            ready.add_metric([schedule, owner], n)
        retrying = GaugeMetricFamily("cronkeeper_outbox_retrying_jobs", "Available jobs that "
                                     "already failed at least once.", labels=["schedule", "owner"])
        for schedule, owner, n in dbo.outbox_retrying(conn):
            retrying.add_metric([schedule, owner], n)
        dead = GaugeMetricFamily("cronkeeper_dead_letters", "Dead jobs waiting for an operator "
                                 "(cronkeeper dlq), per schedule and owner.",
                                 labels=["schedule", "owner"])
        for schedule, owner, n in dbo.outbox_dead(conn):
            dead.add_metric([schedule, owner], n)
        attempts = CounterMetricFamily("cronkeeper_attempts_started", "Job attempts started by "
                                       "the whole fleet (the attempts table's highest id).")
        attempts.add_metric([], attempts_high_water(conn))
        return [up, depth, oldest, ready, retrying, dead, attempts, *self._notifications(conn),
                *self._fleet(conn), *self._schedules(conn)]

    def _notifications(self, conn: Any) -> list:
        """Fleet-wide notification figures (docs/notifications.md): dead letters counted instead
        of sent (a counter kept in notification_subjects), and notifications waiting to be sent
        with the age of the oldest. None on a schema without the tables (a worker of this
        release on the previous release's schema)."""
        from cronkeeper.db.notification_subjects import subjects_suppressed
        from cronkeeper.db.notifications import notifications_table, notifications_waiting

        if not notifications_table(conn):
            return []
        suppressed = CounterMetricFamily(
            "cronkeeper_notifications_suppressed", "Dead letters counted instead of sent: their "
            "schedule (or task) was already told dead and had not recovered (the whole fleet).",
            labels=["event"])
        suppressed.add_metric(["dead"], subjects_suppressed(conn))
        count, age = notifications_waiting(conn)
        waiting = GaugeMetricFamily("cronkeeper_notifications_pending", "Notifications not sent "
                                    "yet (waiting for their first try or a retry).")
        waiting.add_metric([], count)
        oldest = GaugeMetricFamily("cronkeeper_notifications_oldest_pending_age_seconds",
                                   "Age of the oldest notification not sent yet (0: none).")
        oldest.add_metric([], max(age, 0.0))
        return [suppressed, waiting, oldest]

    def _fleet(self, conn: Any) -> list:
        from cronkeeper.db.instances import instances_live

        live = instances_live(conn, self.cluster, self.live_within)
        instances = GaugeMetricFamily("cronkeeper_instances", "Live instances of the cluster "
                                      "(recent heartbeat), by kind.", labels=["kind"])
        digests = GaugeMetricFamily("cronkeeper_schedule_digests", "Distinct schedule-set digests "
                                    "among live instances of a kind (above 1: they disagree).",
                                    labels=["kind"])
        tzdata = GaugeMetricFamily("cronkeeper_tzdata_versions", "Distinct IANA tzdata versions "
                                   "among live instances (above 1: they disagree).")
        for kind in ("scheduler", "worker", "relay"):
            mine = [i for i in live if i["kind"] == kind]
            instances.add_metric([kind], len(mine))
            digests.add_metric([kind], len({i["schedules_digest"] for i in mine}))
        tzdata.add_metric([], len({i["tzdata_version"] for i in live}))
        return [instances, digests, tzdata]

    def _schedules(self, conn: Any) -> list:
        from cronkeeper.db.periods import periods_last_emitted, periods_latest

        current = self._current_cached(conn)
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
            if cached is not None and cached[0] == after and cached[1] == version_id:
                upcoming = cached[2]  # nothing decided since the last scrape: same next fire
            else:
                upcoming = trigger.next_fire(after)
                known[name] = (after, version_id, upcoming)
            if upcoming is not None:
                next_fire.add_metric([name, owner], upcoming.timestamp())
        families = [last_fire, next_fire, source, *self._runtime_families(conn, current)]
        if self.audit:
            families.append(self._missing_family(current))
        return families

    def _runtime_families(self, conn: Any, current: dict[str, _Current]) -> list:
        """docs/observability.md, timeouts matched to the work: the p99 run time of each schedule's last 100
        finished attempts (a timed-out one counted at its timeout; no series before one has
        finished), its timeout, and its attempts that timed out in the last 24 hours: the
        figures of ``status``, from its statement, read again at most every RUNTIMES_EVERY."""
        from cronkeeper.db.attempts import attempts_runtimes
        from cronkeeper.runtimes import SAMPLE

        if clock.monotonic() - self._runtimes_at >= RUNTIMES_EVERY:
            self._runtimes = attempts_runtimes(conn, sorted(current), SAMPLE)
            self._runtimes_at = clock.monotonic()
        figures = self._runtimes
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

    def _parsed(self, rows: list) -> Iterable[tuple[str, list]]:
        """(schedule, versions) of version rows ordered by schedule; a schedule with a row that
        cannot be read is left out (warned once), not the whole audit."""
        from itertools import groupby

        from cronkeeper.audit import versions_from_rows

        for name, group in groupby(rows, key=lambda row: row[1]):
            try:
                yield name, versions_from_rows(group)[name]
            except ValueError as exc:
                self._warn_once(str(exc))

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("metrics: %s", message, extra={"action": "metrics_version_unreadable"})

    def _missing_family(self, current: dict[str, _Current]) -> GaugeMetricFamily:
        """The last audit's missing counts. The audit itself runs in a thread of its own, at
        most every AUDIT_EVERY seconds after the previous one ended, never inside a scrape: at
        10,000 schedules it takes longer than Prometheus waits for a scrape. Until the first
        audit has finished the family is empty (unknown), never a reassuring 0."""
        with self._lock:
            if not self._auditing and clock.monotonic() - self._audit_at >= AUDIT_EVERY:
                self._auditing = True
                threading.Thread(target=self._audit, daemon=True, name="metrics-audit").start()
            found, audited = dict(self._missing), self.audited.is_set()
        family = GaugeMetricFamily("cronkeeper_periods_missing", "Periods of the last hour due "
                                   "beyond grace with no recorded outcome (the history audit).",
                                   labels=["schedule", "owner"])
        if audited:
            for name, entry in current.items():  # in force, not in the audited window: 0
                found.setdefault((name, entry.owner), 0)
        for (name, owner), n in sorted(found.items()):
            family.add_metric([name, owner], n)
        return family

    def _audit(self) -> None:
        """Audit the last hour of every schedule (``history``'s rules), AUDIT_CHUNK schedules
        at a time (their versions parsed, their periods read in one statement, then let go),
        and log each newly missing period at warning."""
        from cronkeeper.audit import Status, audit_schedule, in_window, records_from_rows
        from cronkeeper.db.periods import periods_windows
        from cronkeeper.db.schedule_versions import versions_all, versions_in_force
        from cronkeeper.db.sessions import session_utc

        missing: dict[tuple[str, str], int] = {}
        try:
            with self.engine.connect() as conn:
                now = session_utc(conn)
                since = now - AUDIT_WINDOW
                names = [row.schedule for row in versions_in_force(conn)]
                for i in range(0, len(names), AUDIT_CHUNK):
                    chunk = names[i:i + AUDIT_CHUNK]
                    versions = {}
                    for name, vs in self._parsed(versions_all(conn, chunk)):
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


_current: Metrics | None = None


def current() -> Metrics:
    """The metrics this process serves (a no-op object when it serves none)."""
    return _current if _current is not None else NullMetrics()


def serve(
    bind: tuple[str, int], kind: str, engine: Any = None, *, cluster: str = "default",
    registry: CollectorRegistry | None = None,
) -> Metrics:
    """Start prometheus-client's HTTP server on ``bind`` (loopback unless told otherwise) and
    return the metrics object. With an ``engine``, queue and fleet figures come from the
    database on each scrape (the scheduler also audits the last hour for missing periods)."""
    global _current
    metrics = Metrics(registry, kind=kind)
    if engine is not None:
        metrics.registry.register(DatabaseCollector(engine, cluster, audit=kind == "scheduler"))
    host, port = bind
    server, _thread = start_http_server(port, addr=host or "127.0.0.1", registry=metrics.registry)
    metrics.server = server  # type: ignore[attr-defined]
    _current = metrics
    log.info("metrics on http://%s:%d/metrics", host, server.server_port,
             extra={"action": "metrics_serving"})
    return metrics
