"""Leadership: one leader per cluster, through a PostgreSQL session advisory lock.

State diagram (one ``Node`` per daemon process)::

      start ──► CONNECTING ──(proxy detected: session not pinned)──► FATAL (refuse to run)
                    │ ▲
        connected   │ │ connection lost / lock or term lost / no progress
                    ▼ │       (backoff, then reconnect)
                 STANDBY ─── blocked in pg_advisory_lock(key) on the lock session; the
                    │         housekeeping thread deposes a leader whose heartbeat is stale
                    │ lock granted
                    ▼
                 LEADER(term) ── term = term + 1 recorded; every write transaction begins with
                    │            leadership_confirm (heartbeat, lock held, term unchanged)
                    │ SIGTERM
                    ▼
                 STOPPED ── current tick finished, lock released

Mechanisms:
- Takeover after a leader dies: its backend ends, PostgreSQL frees the lock, and the standby
  already blocked on it is granted it at once (no polling).
- A frozen leader (SIGSTOP, paused VM) keeps its lock: standbys terminate its backend once its
  heartbeat is older than ``leader_timeout``, and the server ends the idle lock session after
  ``leader_timeout`` too (idle_session_timeout), even with no standby. Bound: leader_timeout
  plus one housekeeping interval. On resuming it finds its session gone and writes nothing.
- A leader whose work makes no progress for ``stall_timeout`` (a hung query, a stuck thread)
  terminates its own lock session. Progress is each bounded step of the term's work done: a
  page of stored versions read back, a batch of versions adopted and committed, a claim batch
  sent, a tick committed, 5,000 schedules of a pass over the set in memory. Work that grows with the schedule set (adopting 100,000, reading them
  back after a takeover, a long catch-up) is many steps, never one longer than the bound, and
  each step commits: a term cut short leaves what it did for the next one to build on.
- Correctness never rests on the lock: the per-period unique constraint does that.
- The database away (restarting, unreachable, refusing connections) is said when it begins,
  when its error changes kind and once a minute, never per backoff step, and its end is said
  with how long it lasted (``cronkeeper.outage``); a lost leadership is said each time.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from cronkeeper import __version__, clock
from cronkeeper.db import leadership as dbl
from cronkeeper.db import prune as dbp
from cronkeeper.db import sessions as dbsession
from cronkeeper.db.engine import (
    DRIVER_ERRORS,
    URL,
    Engine,
    RawConnection,
    describe,
    driver,
    leader_lock_key,
    refuses_writes,
)
from cronkeeper.db.instances import instances_heartbeat, instances_stopped
from cronkeeper.errors import LeadershipLost, PoolerDetected
from cronkeeper.outage import OutageReport, kind_of
from cronkeeper.schedule.model import ScheduleSet
from cronkeeper.scheduler import LOG_EACH_UP_TO, Scheduler, TickReport
from cronkeeper.timing import tzdata_version

log = logging.getLogger("cronkeeper.election")
# What ends a session (and is retried): the database, a lost lock or term, the network.
_SESSION_ERRORS: tuple[type[BaseException], ...] = (*DRIVER_ERRORS, LeadershipLost, OSError)


class Role(StrEnum):
    CONNECTING = "connecting"
    STANDBY = "standby"
    LEADER = "leader"
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class NodeOptions:
    leader_timeout: float = 10.0  # a leader silent this long is deposed
    stall_timeout: float = 10.0  # a leader whose work makes no progress this long steps down
    heartbeat_interval: float = 1.0  # leader heartbeat (and longest sleep between ticks)
    housekeeping_interval: float = 1.0
    instance_heartbeat_interval: float = 2.0
    prune_interval: float = 60.0
    retention_jobs_days: float = 14.0
    retention_periods_days: float = 400.0
    prune_batch: int = 1000


def _settle_heap() -> None:
    """Collect once, then exempt what survives (specs, triggers, per-schedule state) from future
    collections: the cyclic collector's full passes otherwise walk every schedule's objects
    again and again while a burst allocates its rows. Freed objects are still freed (reference
    counting); only cycles among frozen objects would outlive a reload."""
    gc.collect()
    gc.freeze()


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


class Node:
    def __init__(
        self,
        *,
        url: URL,
        schema: str,
        cluster: str,
        engine: Engine,
        schedules: ScheduleSet,
        instance_id: str,
        options: NodeOptions = NodeOptions(),
        metrics=None,
    ) -> None:
        self.url = url
        self.schema = schema
        self.cluster = cluster
        self.engine = engine
        self.schedules = schedules
        self.instance_id = instance_id
        self.options = options
        self.metrics = metrics
        self.lock_key = leader_lock_key(schema, cluster)
        self.role = Role.CONNECTING
        self.term: int | None = None
        self.fatal: BaseException | None = None
        self.stopping = threading.Event()
        self.leading = threading.Event()  # set while leader (tests and readiness wait on it)
        self.connected = threading.Event()
        self._wake = threading.Event()
        self._pending: ScheduleSet | None = None
        self._conn: RawConnection | None = None
        self._waiting_for_lock = False
        self._lock_pid: int | None = None
        self.last_progress = clock.monotonic()
        self.skew_seconds: float | None = None
        self.finished = threading.Event()  # the node thread has ended (housekeeping stops then)
        self._outage = OutageReport()  # the session loop's: what it says while the database is away

    # -- control from other threads -------------------------------------------------------------
    def request_stop(self) -> None:
        self.stopping.set()
        self._wake.set()
        # The wait on the lock may start just after this: keep cancelling while it waits.
        threading.Thread(target=self._cancel_lock_wait, name="cancel-wait", daemon=True).start()

    def _cancel_lock_wait(self) -> None:
        deadline = clock.monotonic() + 10.0
        while not self.finished.is_set() and clock.monotonic() < deadline:
            conn = self._conn
            if conn is not None and self._waiting_for_lock:
                with contextlib.suppress(Exception):  # the loop notices stopping either way
                    conn.cancel_safe(timeout=2.0)
            self.finished.wait(0.1)

    def reload(self, schedules: ScheduleSet) -> None:
        if self.role is not Role.LEADER:
            self.schedules = schedules  # a standby reports the digest of what it would run
        self._pending = schedules
        self._wake.set()

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        housekeeping = threading.Thread(target=self._housekeeping, name="housekeeping", daemon=True)
        housekeeping.start()
        delay = 0.2
        try:
            while not self.stopping.is_set():
                try:
                    self._one_session()
                    delay = 0.2
                except PoolerDetected as exc:
                    self.fatal = exc
                    log.error("%s", exc, extra={"action": "refused_pooler"})
                    return
                except _SESSION_ERRORS as exc:
                    was_leader = self.role is Role.LEADER
                    self._set_role(Role.CONNECTING)
                    if self.stopping.is_set():
                        break
                    self._say_failed(exc, delay, was_leader)
                    self.stopping.wait(delay)
                    delay = min(delay * 2, 5.0)
                except Exception as exc:  # a bug or unreadable data: step down, say so, retry
                    self._set_role(Role.CONNECTING)
                    log.error(
                        "unexpected %s: %s; stepping down, retrying in %.1fs",
                        type(exc).__name__, exc, delay,
                        extra={"action": "internal_error", "term": self.term},
                    )
                    log.debug("traceback", exc_info=True, extra={"action": "internal_error"})
                    self.stopping.wait(delay)
                    delay = min(delay * 2, 5.0)
                finally:
                    self._close()
        finally:
            self._set_role(Role.STOPPED)
            self.finished.set()
            self._forget_instance()

    def _say_failed(self, exc: BaseException, delay: float, was_leader: bool) -> None:
        """A lost leadership is said each time (it follows a win, so it cannot flood); the
        database being away is said when the outage begins, when its kind changes, and then
        once a minute (``cronkeeper.outage``)."""
        if was_leader:
            self._outage.failed(clock.monotonic(), kind_of(describe(exc)))
            log.warning("leadership lost: %s; retrying in %.1fs", describe(exc), delay,
                        extra={"action": "leader_lost", "term": self.term})
        else:
            self._say_outage(exc, "database unavailable", "database still unavailable",
                             f"retrying in {delay:.1f}s (backoff up to 5s; said again each "
                             "minute while it lasts)")

    def _say_outage(self, exc: BaseException, first: str, again: str, plan: str) -> None:
        """An outage (the database away, or refusing writes) said when it begins or changes
        kind, then once a minute (``cronkeeper.outage``)."""
        notice = self._outage.failed(clock.monotonic(), kind_of(describe(exc)))
        if notice is not None and notice.first:
            log.warning("%s: %s; %s", first, describe(exc), plan,
                        extra={"action": "db_unavailable", "term": self.term})
        elif notice is not None:
            log.warning("%s: %s; for %.0fs, %d failed tries", again, describe(exc),
                        notice.lasted, notice.failures,
                        extra={"action": "db_unavailable", "term": self.term})

    def _say_recovered(self) -> None:
        notice = self._outage.recovered(clock.monotonic())
        if notice is not None:
            log.warning("database reconnected after %.1fs (%d failed tries)", notice.lasted,
                        notice.failures, extra={"action": "db_reconnected", "term": self.term})

    def _one_session(self) -> None:
        conn = dbl.lock_connect(self.url, self.schema, f"cronkeeper-lock:{self.instance_id}")
        self._conn = conn
        self._lock_pid = dbsession.backend_pid_now(conn)
        with dbl.lock_connect(self.url, self.schema, "cronkeeper-probe") as probe:
            if not dbsession.session_is_pinned(conn, probe):
                raise PoolerDetected(
                    "the lock connection does not keep one database backend across transactions: "
                    "a transaction-pooling proxy (PgBouncer, Supavisor) sits in between, and a "
                    "session advisory lock cannot elect a leader through it. Point "
                    "--database-url at PostgreSQL directly (or at a session-pooling port)."
                )
        self._say_recovered()
        self.connected.set()
        self._set_role(Role.STANDBY)
        self._waiting_for_lock = True
        try:
            granted = not self.stopping.is_set() and dbl.lock_wait(conn, self.lock_key)
        finally:
            self._waiting_for_lock = False
        if not granted:
            if self.stopping.is_set():
                return
            raise LeadershipLost("the wait for the leader lock was cancelled")
        if self.stopping.is_set():
            dbl.lock_release(conn, self.lock_key)
            return
        self.term, since = dbl.leadership_claim(conn, self.cluster, self.instance_id)
        self.last_progress = clock.monotonic()
        dbsession.session_idle_timeout_set(conn, self.options.leader_timeout)
        self._set_role(Role.LEADER)
        log.info("leadership won", extra={"action": "leader_won", "term": self.term,
                                          "instance": self.instance_id})
        self._lead(conn)

    def _lead(self, conn: RawConnection) -> None:
        """Lead until stopped or the session ends. A write the database refuses for want of
        space or memory (``refuses_writes``) does not end the term: no other instance could
        write either, so stepping down and winning again would only flap (a term per backoff
        step). The leader keeps its lock, rolls back, says so once a minute
        (``cronkeeper.outage``), and starts the term's work again from the database after a
        backoff short enough that neither the standbys nor its own watchdog take it for stuck
        (each start heartbeats first)."""
        delay = 0.2
        cap = min(5.0, self.options.stall_timeout / 2, self.options.leader_timeout / 2)
        while True:
            try:
                self._lead_term(conn)
                return
            except DRIVER_ERRORS as exc:
                if self.stopping.is_set() or not refuses_writes(exc) or conn.closed or conn.broken:
                    raise
                self._say_outage(exc, "database refuses writes", "database still refuses writes",
                                 f"keeping leadership, retrying in {delay:.1f}s (said again "
                                 "each minute while it lasts)")
            self.last_progress = clock.monotonic()  # holding on, not stuck
            if self.stopping.wait(delay):
                with contextlib.suppress(*DRIVER_ERRORS):  # a write: it may be refused too
                    dbl.leadership_release(conn, self.cluster, self.term or 0)
                with contextlib.suppress(*DRIVER_ERRORS):
                    dbl.lock_release(conn, self.lock_key)
                return
            self.last_progress = clock.monotonic()
            delay = min(delay * 2, cap)

    def _lead_term(self, conn: RawConnection) -> None:
        scheduler = Scheduler(
            conn, cluster=self.cluster, term=self.term or 0, lock_key=self.lock_key,
            on_tick=self._report, should_stop=self.stopping.is_set, on_progress=self._progress,
            resume_floor=timedelta(days=self.options.retention_periods_days),
        )
        scheduler.load_versions()
        scheduler.tick_until_current()  # periods due under the versions in force, up to now
        if not scheduler.behind:  # (a stop cut the catch-up short: adopting now would leave a gap)
            scheduler.adopt(self.schedules)
        _settle_heap()
        self.leading.set()
        next_prune = clock.monotonic()
        while not self.stopping.is_set():
            pending, self._pending = self._pending, None
            if pending is not None:
                scheduler.tick_until_current()
                if scheduler.behind:  # stopping mid catch-up: the new set waits for the next leader
                    break
                scheduler.adopt(pending)
                self.schedules = pending
                _settle_heap()
            report = scheduler.tick()
            self.last_progress = clock.monotonic()
            if clock.monotonic() >= next_prune:
                self._prune(conn, scheduler)
                next_prune = clock.monotonic() + self.options.prune_interval
            wait = self.options.heartbeat_interval
            upcoming = scheduler.next_due()
            if upcoming is not None:
                wait = min(wait, max(0.0, (upcoming - report.now).total_seconds()) + 0.001)
            self._wake.wait(wait)
            self._wake.clear()
        # graceful stop: the current tick is done; hand the lock over now
        try:
            dbl.leadership_release(conn, self.cluster, scheduler.term)
            dbl.lock_release(conn, self.lock_key)
            log.info("leadership released", extra={"action": "leader_released", "term": self.term})
        except DRIVER_ERRORS as exc:
            log.warning("releasing leadership: %s", describe(exc), extra={"action": "leader_release_failed"})

    def _prune(self, conn: RawConnection, scheduler: Scheduler) -> None:
        with conn.transaction():
            scheduler.confirm()
            counts = dbp.prune(
                conn,
                jobs_days=self.options.retention_jobs_days,
                periods_days=self.options.retention_periods_days,
                batch=self.options.prune_batch,
            )
        if any(counts):
            log.info("pruned jobs=%d attempts=%d periods=%d", *counts, extra={"action": "pruned"})

    def _progress(self) -> None:
        """The scheduler finished a bounded step of work (see the module's docstring)."""
        self.last_progress = clock.monotonic()

    def _report(self, report: TickReport) -> None:
        self.last_progress = clock.monotonic()  # each committed tick is progress
        if self._outage.down:  # writes refused (``_lead``), and now one committed
            notice = self._outage.recovered(clock.monotonic())
            assert notice is not None
            log.warning("database accepts writes again after %.1fs (%d failed tries)",
                        notice.lasted, notice.failures,
                        extra={"action": "db_reconnected", "term": self.term})
        decisions = report.decisions
        # A line per period costs ~15 us: fine for a few, a second of the leader's time for a
        # burst of 100,000. Past LOG_EACH_UP_TO, one summary line at info, each period at debug.
        each = len(decisions) <= LOG_EACH_UP_TO
        if not each:
            fired = sum(1 for _, d, _ in decisions if d.reason is None)
            skipped = Counter(str(d.reason) for _, d, _ in decisions if d.reason is not None)
            log.info(
                "fired %d jobs, skipped %d periods%s in one tick", fired, len(decisions) - fired,
                "".join(f", {n} {r}" for r, n in sorted(skipped.items())),
                extra={"action": "fire_batch", "term": self.term},
            )
        fire_level = logging.INFO if each else logging.DEBUG
        skip_level = logging.WARNING if each else logging.DEBUG
        if each or log.isEnabledFor(logging.DEBUG):
            for schedule, decision, job_id in decisions:
                if decision.reason is None:
                    log.log(
                        fire_level, "fired %s", schedule,
                        extra={"action": "fire", "schedule": schedule, "term": self.term,
                               "scheduled_for": decision.scheduled_for.isoformat(),
                               "job_id": job_id},
                    )
                else:
                    log.log(
                        skip_level, "skipped %s (%s)", schedule, decision.reason,
                        extra={"action": "skip", "schedule": schedule, "term": self.term,
                               "scheduled_for": decision.scheduled_for.isoformat(),
                               "reason": str(decision.reason)},
                    )
        if report.lost:
            log.warning(
                "%d periods were already decided by another leader; emitted nothing for them",
                report.lost, extra={"action": "claim_lost", "term": self.term},
            )
        if self.metrics is not None:
            self.metrics.observe_tick(report, self.schedules)

    def _set_role(self, role: Role) -> None:
        self.role = role
        if role is not Role.LEADER:
            self.leading.clear()
        if self.metrics is not None:
            self.metrics.set_leader(role is Role.LEADER, self.term)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    # -- housekeeping thread ------------------------------------------------------------------------
    def _housekeeping(self) -> None:
        next_beat = 0.0
        while not self.finished.wait(self.options.housekeeping_interval):
            try:
                now = clock.monotonic()
                if now >= next_beat:
                    self._instance_heartbeat()
                    next_beat = now + self.options.instance_heartbeat_interval
                if self.role is Role.STANDBY:
                    self._depose_stale_leader()
                elif self.role is Role.LEADER and now - self.last_progress > self.options.stall_timeout:
                    self._step_down_stalled()
            except Exception as exc:  # noqa: BLE001 - housekeeping must outlive a bad moment
                log.debug("housekeeping: %s", describe(exc), extra={"action": "housekeeping_error"})

    def _instance_heartbeat(self) -> None:
        local = clock.wall()
        with self.engine.begin() as conn:
            db_now = instances_heartbeat(
                conn, cluster=self.cluster, instance_id=self.instance_id, kind="scheduler",
                host=socket.gethostname(), pid=os.getpid(), version=__version__,
                schedules_digest=self.schedules.digest, tzdata_version=tzdata_version(),
                role="leader" if self.role is Role.LEADER else "standby", local_now=local,
            )
        self.skew_seconds = (db_now - local).total_seconds()
        if self.metrics is not None:
            self.metrics.set_skew(self.skew_seconds)

    def _depose_stale_leader(self) -> None:
        with self.engine.begin() as conn:
            pid = dbl.leadership_depose_stale(driver(conn), self.cluster, self.lock_key, self.options.leader_timeout)
        if pid is not None:
            log.warning(
                "deposed a leader silent for over %.0fs (backend %d terminated)",
                self.options.leader_timeout, pid, extra={"action": "leader_deposed"},
            )

    def _step_down_stalled(self) -> None:
        pid = self._lock_pid
        log.error(
            "no progress for over %.0fs (no tick or batch of work done): stepping down",
            self.options.stall_timeout,
            extra={"action": "leader_stalled", "term": self.term},
        )
        if pid is not None:
            with self.engine.begin() as conn:
                dbsession.backend_terminate(conn, pid)
        self.last_progress = clock.monotonic()

    def _forget_instance(self) -> None:
        try:
            with self.engine.begin() as conn:
                instances_stopped(conn, self.cluster, self.instance_id)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
