"""Leadership: one leader per cluster, through a PostgreSQL session advisory lock.

This module only elects. When it wins, it hands the term (``term.Term``: the lock session, the
term number, the fencing check and the channels back) to the leader's loop it was given
(``lead``: ``leading.LeaderLoop.lead`` in the daemon), and watches that loop's progress.

State diagram (one ``Node`` per daemon process)::

      start ──► CONNECTING ──(proxy detected: session not pinned)──► FATAL (refuse to run)
                    │ ▲
        connected   │ │ connection lost / lock or term lost / no progress
                    ▼ │       (backoff, then reconnect)
                 STANDBY ─── blocked in pg_advisory_lock(key) on the lock session; the
                    │         housekeeping thread deposes a leader whose heartbeat is stale
                    │ lock granted
                    ▼
                 LEADER(term) ── term = term + 1 recorded; lead(term) runs the leader's loop,
                    │            every write transaction of which begins with Term.confirm
                    │            (heartbeat, lock held, term unchanged)
                    │ SIGTERM
                    ▼
                 STOPPED ── the loop's current tick finished, lock released

Signals (``Node.signals``), for readiness, metrics and tests to wait on, never to sleep for:
the Events ``connected`` (a lock session is up: READY=1), ``leading`` (from GAINED to LOST) and
``finished``, and listeners called with each ``Signal`` in the order it happens. LOST comes
before a graceful stop releases the lock, so the next leader's GAINED follows it. Progress goes
the other way: the loop calls ``Term.progress`` after each bounded step; the watchdog reads it.

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
import logging
import threading
from collections.abc import Callable

from cronkeeper import clock, instance
from cronkeeper.db import leadership as dbl
from cronkeeper.db import sessions as dbsession
from cronkeeper.db.engine import (
    DRIVER_ERRORS,
    URL,
    Engine,
    RawConnection,
    describe,
    driver,
    leader_lock_key,
)
from cronkeeper.election_signals import NodeOptions, Role, Signal, Signals
from cronkeeper.errors import DatabaseError, LeadershipLost, PoolerDetected
from cronkeeper.logs import say_survived
from cronkeeper.outage import OutageReport, Repeats, kind_of
from cronkeeper.term import Term

log = logging.getLogger("cronkeeper.election")
# What ends a session (and is retried): the database, a lost lock or term, the network.
_SESSION_ERRORS: tuple[type[BaseException], ...] = (*DRIVER_ERRORS, LeadershipLost, OSError)
# What fails a housekeeping step for the database's sake (its pool's timeout among them).
_STEP_ERRORS: tuple[type[BaseException], ...] = (*DRIVER_ERRORS, DatabaseError)


class Node:
    def __init__(
        self,
        *,
        url: URL,
        schema: str,
        cluster: str,
        engine: Engine,
        instance_id: str,
        lead: Callable[[Term], None],
        schedules_digest: Callable[[], str],
        options: NodeOptions | None = None,
        metrics=None,
    ) -> None:
        self.url = url
        self.schema = schema
        self.cluster = cluster
        self.engine = engine
        self.instance_id = instance_id
        self.lead = lead  # the leader's loop: runs a won term (see Term)
        self.schedules_digest = schedules_digest  # what the instance registry shows
        self.options = options or NodeOptions()
        self.metrics = metrics
        self.lock_key = leader_lock_key(schema, cluster)
        self.role = Role.CONNECTING
        self.term: int | None = None
        self.fatal: BaseException | None = None
        self.stopping = threading.Event()
        self.signals = Signals()
        self._conn: RawConnection | None = None
        self._waiting_for_lock = False
        self.lock_pid: int | None = None
        self.last_progress = clock.monotonic()
        self.housekeeping = Housekeeping(self)
        self._outage = OutageReport()  # the session loop's: what it says while the database is away

    @property
    def database_away(self) -> bool:
        """Whether the session loop is saying the database is away (from its first failure to
        the session that follows); read by the housekeeping thread, so as not to say it twice."""
        return self._outage.down

    def healthy(self) -> bool:
        """False while a leader has made no progress for ``stall_timeout`` (the housekeeping
        thread is about to step it down): what the systemd watchdog is fed on."""
        if self.role is Role.LEADER:
            return clock.monotonic() - self.last_progress < self.options.stall_timeout
        return True

    # -- control from other threads -------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop electing; a leader's loop sees ``Term.stopping`` (wake it too: ``lead`` waits on
        its own events)."""
        self.stopping.set()
        # The wait on the lock may start just after this: keep cancelling while it waits.
        threading.Thread(target=self._cancel_lock_wait, name="cancel-wait", daemon=True).start()

    def _cancel_lock_wait(self) -> None:
        deadline = clock.monotonic() + 10.0
        while not self.signals.finished.is_set() and clock.monotonic() < deadline:
            conn = self._conn
            if conn is not None and self._waiting_for_lock:
                with contextlib.suppress(Exception):  # the loop notices stopping either way
                    conn.cancel_safe(timeout=2.0)
            self.signals.finished.wait(0.1)

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        threading.Thread(target=self.housekeeping.run, name="housekeeping", daemon=True).start()
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
            self.signals.publish(Signal.FINISHED, self.term)
            instance.record_stopped(self.engine, self.cluster, self.instance_id)

    def _say_failed(self, exc: BaseException, delay: float, was_leader: bool) -> None:
        """A lost leadership is said each time (it follows a win, so it cannot flood); the
        database being away is said when the outage begins, when its kind changes, and then
        once a minute (``cronkeeper.outage``)."""
        if was_leader:
            self._outage.failed(clock.monotonic(), kind_of(describe(exc)))
            log.warning("leadership lost: %s; retrying in %.1fs", describe(exc), delay,
                        extra={"action": "leader_lost", "term": self.term})
            return
        notice = self._outage.failed(clock.monotonic(), kind_of(describe(exc)))
        if notice is not None and notice.first:
            log.warning("database unavailable: %s; retrying in %.1fs (backoff up to 5s; said "
                        "again each minute while it lasts)", describe(exc), delay,
                        extra={"action": "db_unavailable", "term": self.term})
        elif notice is not None:
            log.warning("database still unavailable: %s; for %.0fs, %d failed tries",
                        describe(exc), notice.lasted, notice.failures,
                        extra={"action": "db_unavailable", "term": self.term})

    def _say_recovered(self) -> None:
        notice = self._outage.recovered(clock.monotonic())
        if notice is not None:
            log.warning("database reconnected after %.1fs (%d failed tries)", notice.lasted,
                        notice.failures, extra={"action": "db_reconnected", "term": self.term})

    def _one_session(self) -> None:
        conn = dbl.lock_connect(self.url, self.schema, f"cronkeeper-lock:{self.instance_id}")
        self._conn = conn
        self.lock_pid = dbsession.backend_pid_now(conn)
        with dbl.lock_connect(self.url, self.schema, "cronkeeper-probe") as probe:
            if not dbsession.session_is_pinned(conn, probe):
                raise PoolerDetected(
                    "the lock connection does not keep one database backend across transactions: "
                    "a transaction-pooling proxy (PgBouncer, Supavisor) sits in between, and a "
                    "session advisory lock cannot elect a leader through it. Point "
                    "--database-url at PostgreSQL directly (or at a session-pooling port)."
                )
        self._say_recovered()
        self._set_role(Role.STANDBY)
        self.signals.publish(Signal.CONNECTED, self.term)
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
        quiet = min(self.options.stall_timeout, self.options.leader_timeout)
        self.lead(Term(conn, self.term, self.cluster, self.lock_key, self.stopping,
                       self._progress, quiet))
        # the loop returned: the process stops (graceful: its current tick is done)
        self._set_role(Role.STOPPED if self.stopping.is_set() else Role.CONNECTING)
        self._release(conn)

    def _release(self, conn: RawConnection) -> None:
        """Hand the lock over now, not when the session ends."""
        try:
            dbl.leadership_release(conn, self.cluster, self.term or 0)
            dbl.lock_release(conn, self.lock_key)
            log.info("leadership released", extra={"action": "leader_released", "term": self.term})
        except DRIVER_ERRORS as exc:  # the lock goes with the session, closed next
            log.warning("releasing leadership: %s", describe(exc), extra={"action": "leader_release_failed"})

    def _progress(self) -> None:
        """The leader's loop finished a bounded step of work (see the module's docstring)."""
        self.last_progress = clock.monotonic()

    def _set_role(self, role: Role) -> None:
        was_leader = self.role is Role.LEADER
        self.role = role
        if self.metrics is not None:
            self.metrics.set_leader(role is Role.LEADER, self.term)
        if role is Role.LEADER:
            self.signals.publish(Signal.GAINED, self.term)
        elif was_leader:
            self.signals.publish(Signal.LOST, self.term)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


class Housekeeping:
    """A node's second thread, every ``housekeeping_interval`` until the node has finished: the
    instance heartbeat (the registry ``status`` and ``web`` show; the clock skew), then by
    role: a standby deposes a leader whose heartbeat is stale, a leader that made no progress
    for ``stall_timeout`` ends its own lock session. (The node records its instance stopped on
    the way out.)"""

    GRACE = 5.0  # seconds a step fails in a row before it is said

    def __init__(self, node: Node) -> None:
        self.node = node
        self.skew_seconds: float | None = None
        # Per step, its database errors (while the session answers): a standby whose heartbeat
        # is refused still deposes, and one step's success does not end another's outage.
        self._outages: dict[str, OutageReport] = {}
        self._failing_since: dict[str, float] = {}  # step -> its first failure in a row
        self._repeats = Repeats()  # its other errors (a bug), said once a minute

    def run(self) -> None:
        node = self.node
        next_beat = 0.0
        while not node.signals.finished.wait(node.options.housekeeping_interval):
            now = clock.monotonic()
            # Each step apart: one that fails on every pass (a heartbeat the database refuses,
            # no pooled connection free) must not keep a standby from deposing a silent leader
            # or a stalled leader from stepping down.
            if now >= next_beat and self._step("writing the instance heartbeat",
                                               self._instance_heartbeat):
                next_beat = now + node.options.instance_heartbeat_interval
            if node.role is Role.STANDBY:
                self._step("deposing a stale leader", self._depose_stale_leader)
            elif node.role is Role.LEADER and now - node.last_progress > node.options.stall_timeout:
                self._step("stepping down", self._step_down_stalled)

    def _step(self, step: str, run: Callable[[], None]) -> bool:
        """Run one step; whether it succeeded. Its failures are said, never raised: a database
        error as an outage of its own (when it begins, changes kind, once a minute, and its
        end), unless the node's session is saying the database is away already; any other
        error with its traceback, then once a minute while it repeats. Each step apart."""
        try:
            run()
        except _STEP_ERRORS as exc:
            self._database_failed(step, exc)
            return False
        except Exception as exc:  # noqa: BLE001 - housekeeping must outlive a bad moment
            say_survived(log, self._repeats, "housekeeping", step, exc, clock.monotonic())
            return False
        since = self._failing_since.pop(step, None)
        outage = self._outages.get(step)
        notice = outage.recovered(clock.monotonic()) if outage is not None else None
        if notice is not None and since is not None:
            log.warning("housekeeping recovered: after=%.1fs while=%s", clock.monotonic() - since,
                        step, extra={"action": "housekeeping_recovered"})
        return True

    def _database_failed(self, step: str, exc: BaseException) -> None:
        """Said once the step has failed for ``GRACE`` seconds in a row (a pass or two lost to a
        moment's blip harm nothing: each step is tried again every second), and not while the
        session says the database is away (``db_unavailable``, ``leader_lost``)."""
        now = clock.monotonic()
        since = self._failing_since.setdefault(step, now)
        if self.node.database_away or now - since < self.GRACE:
            return
        outage = self._outages.setdefault(step, OutageReport())
        notice = outage.failed(now, kind_of(describe(exc)))
        if notice is not None and notice.first:
            log.warning("housekeeping failed: for=%.0fs while=%s error=%s (said again each minute "
                        "while it lasts)", now - since, step, describe(exc),
                        extra={"action": "housekeeping_failed"})
        elif notice is not None:
            log.warning("housekeeping still failing: for=%.0fs while=%s error=%s", now - since,
                        step, describe(exc),
                        extra={"action": "housekeeping_failed"})

    def _instance_heartbeat(self) -> None:
        node = self.node
        self.skew_seconds = instance.heartbeat(
            node.engine, cluster=node.cluster, instance_id=node.instance_id,
            leader=node.role is Role.LEADER, schedules_digest=node.schedules_digest())
        if node.metrics is not None:
            node.metrics.set_skew(self.skew_seconds)

    def _depose_stale_leader(self) -> None:
        node = self.node
        with node.engine.begin() as conn:
            pid = dbl.leadership_depose_stale(driver(conn), node.cluster, node.lock_key,
                                              node.options.leader_timeout)
        if pid is not None:
            log.warning(
                "deposed a leader silent for over %.0fs (backend %d terminated)",
                node.options.leader_timeout, pid, extra={"action": "leader_deposed"},
            )

    def _step_down_stalled(self) -> None:
        node = self.node
        pid = node.lock_pid
        log.error(
            "no progress for over %.0fs (no tick or batch of work done): stepping down",
            node.options.stall_timeout, extra={"action": "leader_stalled", "term": node.term},
        )
        if pid is not None:
            with node.engine.begin() as conn:
                dbsession.backend_terminate(conn, pid)
        node.last_progress = clock.monotonic()

