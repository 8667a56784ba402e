"""The database's figures in the metrics (§8), read on each scrape by ``DatabaseCollector`` so
that every instance reports the same truth: outbox depth by state, age of the oldest ready job,
dead letters, jobs waiting to retry, attempts started (fleet-wide), notifications waiting, live
instances, schedule digest and tzdata disagreement; and, per schedule
(``metrics_schedules.ScheduleFamilies``), last and next fire, the run-time figures and periods
missing in the last hour.

Scrapes share one read: the read takes one connection from the process's own pool (the one
its real work uses: a worker's claims and endings, a relay's publishing, the daemon's
housekeeping), so each scrape reading for itself let a burst of scrapes on a slow or locked
database take them all, and the work waited on the pool. One read runs at a time; a scrape
arriving meanwhile waits for it and answers with its result, as does one arriving within
``REUSE_SECONDS`` after it ended. The read gives up on a lock after ``LOCK_WAIT_SECONDS`` and
on any statement after ``STATEMENT_SECONDS`` (``cronkeeper_database_up 0``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from cronkeeper import clock
from cronkeeper.metrics_schedules import ScheduleFamilies
from cronkeeper.outage import OutageReport

log = logging.getLogger("cronkeeper.metrics")

REUSE_SECONDS = 1.0  # a read's result answers the scrapes of this long after it ended
LOCK_WAIT_SECONDS = 5.0  # a read waiting this long for a lock (DDL, VACUUM FULL) gives up
STATEMENT_SECONDS = 30.0  # and any statement of it after this (a scrape_timeout's worth)


class DatabaseCollector(ScheduleFamilies):
    """Queue and fleet figures read from the database on each scrape (a few index scans)."""

    def __init__(self, engine: Any, cluster: str, *, audit: bool = True,
                 live_within: float = 30.0) -> None:
        super().__init__(engine, cluster, audit=audit)
        self.live_within = live_within
        self._outage = OutageReport()
        self._flight = threading.Lock()  # held by the one read under way
        self._read: list = []
        self._read_at = -1e18
        self._read_audits = 0  # the audits finished when it was read

    def collect(self) -> Iterable:
        """The database's families: those of the read that ended within REUSE_SECONDS, or of
        the one under way (waited for), or a new read's (also once an audit has finished since:
        its counts are news). However many scrapes arrive at once, they hold at most one of the
        pool's connections."""
        with self._flight:
            audits = self.audits
            if clock.monotonic() - self._read_at >= REUSE_SECONDS or audits != self._read_audits:
                self._read = self._read_database()
                self._read_at, self._read_audits = clock.monotonic(), audits
            return self._read

    def _read_database(self) -> list:
        from cronkeeper.db.sessions import session_limits, session_utc

        try:
            with self.engine.connect() as conn:
                session_limits(conn, statement_seconds=STATEMENT_SECONDS,
                               lock_seconds=LOCK_WAIT_SECONDS)
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
                *self._fleet(conn), *self._schedules(conn, now)]

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
