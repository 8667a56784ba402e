"""Every metric cronkeeper exports, declared in one place, on an injectable registry (§8).

Two sources:
- this process's own events: leadership and term, fires and fire lag (the leader's ticks),
  clock skew, and the worker's job events (``job_started`` / ``job_finished``);
- the database, read on each scrape by ``DatabaseCollector`` (``metrics_database``) so that
  every instance reports the same truth: outbox depth by state, age of the oldest ready job,
  dead letters, jobs waiting to retry, attempts started (fleet-wide), live instances, schedule
  digest and tzdata disagreement; and per schedule (``metrics_schedules``) last and next fire,
  periods missing in the last hour and the p99 run time, timeout and timed-out attempts of the
  last 24 hours: ``status``'s figures, from the leader's summary while one leads (the
  summarizer's audit), else computed by the scraped process (the audit in a thread of its own
  about once a minute, never inside a scrape; the run-time statement at most once a minute).

Labels are bounded: schedule, owner, outcome, reason, state, kind. Never job ids or error text.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from cronkeeper import __version__
from cronkeeper.metrics_database import DatabaseCollector
from cronkeeper.timing import tzdata_version

log = logging.getLogger("cronkeeper.metrics")

LAG_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600)
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 20)
FAILED = frozenset({"retry", "timeout", "lease_expired", "dead", "failed"})


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
