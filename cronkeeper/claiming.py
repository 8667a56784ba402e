"""The seam every lease holder shares, ``cronkeeper worker`` and ``cronkeeper relay`` alike:
database access that survives the database going away (reconnect with backoff, resume; said
when it begins, once a minute while it lasts, and when it ends: ``cronkeeper.outage``),
registration retried until the database answers, the reap of expired leases, and what the schema
offers (``SchemaFeature``: both also run on the previous release's schema). The notification
sender (``cronkeeper.notify.sender``) holds its leases through the same seam.
What an attempt's ending means for its job is ``cronkeeper.endings``, the same for both."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from cronkeeper import clock
from cronkeeper.db.engine import (
    CONNECTION_ERRORS,
    DRIVER_ERRORS,
    Connection,
    Engine,
    conflicts,
    describe,
    refuses_writes,
)
from cronkeeper.errors import DatabaseError
from cronkeeper.outage import OutageReport, Repeats, kind_of

log = logging.getLogger("cronkeeper.worker")

DB_ERRORS: tuple[type[BaseException], ...] = (*DRIVER_ERRORS, DatabaseError)


class SchemaFeature:
    """Whether the schema has what a migration of this release adds (``probe`` says). A worker
    or relay also runs on the previous release's schema, which lacks it: it is looked up at
    start, and again once a minute while absent, so that after ``cronkeeper migrate`` the
    process uses it without a restart."""

    RECHECK = 60.0

    def __init__(self, probe: Callable[[Connection], bool]) -> None:
        self.probe = probe
        self.present = False
        self._next_check = 0.0

    def due(self) -> bool:
        return not self.present and clock.monotonic() >= self._next_check

    def check(self, conn: Connection) -> None:
        self._next_check = clock.monotonic() + self.RECHECK
        self.present = self.probe(conn)


class ClaimingDatabase:
    """Transactions on a lease holder's engine (a worker's or a relay's); driver errors become
    DatabaseError, and the connection that saw one is invalidated so the pool reconnects.
    ``notes``: whether the schema has the notifications tables (migrations/0013): the endings
    then note dead letters and recoveries (docs/notifications.md)."""

    def __init__(self, engine: Engine) -> None:
        from cronkeeper.db.notifications import notifications_table

        self.engine = engine
        self.notes = SchemaFeature(notifications_table)
        self._outage = OutageReport()
        # Writes refused for want of space (``refuses_writes``) are an outage of their own: the
        # database still answers reads (and some writes), so a success of another action does
        # not end it; only one of an action that was refused does.
        self._refused = OutageReport()
        self._refused_actions: set[str] = set()
        # A deadlock or serialization failure rolled back: the database answers, the statement
        # is tried again; said once a minute per action, never as the database being away.
        self._conflicts = Repeats()
        self._answered = threading.Event()  # set when a statement succeeds after a failure
        self._lock = threading.Lock()
        self._kept = threading.local()
        # Counts the connections seen broken: a connection another thread kept from before
        # one broke is likely dead too (the database restarted, or ended every session).
        self._broken = 0

    @contextlib.contextmanager
    def statement(self, action: str) -> Iterator[Connection]:
        """An autocommit connection kept by the calling thread, for work that is one statement
        (or several that need not commit together): no checkout, ping, BEGIN or COMMIT round
        trip per call. The claim loop and the recorder use it; on any error the connection is
        dropped (invalidated when it broke) and the next call opens another. A connection kept
        from before another thread's broke is replaced before use rather than tried: after an
        outage each thread's statement would otherwise fail once more on its dead connection
        (and say the database was away again, for 0 s)."""
        conn: Connection | None = getattr(self._kept, "conn", None)
        if conn is not None and self._kept.broken != self._broken:
            self._kept.conn = None
            with contextlib.suppress(Exception):
                conn.invalidate()
                conn.close()
            conn = None
        try:
            if conn is None:
                broken = self._broken
                conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
                self._kept.conn, self._kept.broken = conn, broken
            yield conn
        except BaseException as exc:
            self._kept.conn = None
            if conn is not None:
                with contextlib.suppress(Exception):
                    if isinstance(exc, CONNECTION_ERRORS):
                        conn.invalidate()
                    conn.close()
            if isinstance(exc, DB_ERRORS):
                self.down(action, exc)
                raise DatabaseError(f"{action}: {describe(exc)}") from exc
            raise
        self.up(action)

    def has(self, feature: SchemaFeature) -> bool:
        """Whether the schema has ``feature``, looked up again when due (on the calling thread's
        kept connection; a failure leaves the answer as it was: the caller's own statement
        will say what is wrong)."""
        if feature.due():
            try:
                with self.statement("reading the schema") as conn:
                    feature.check(conn)
            except DatabaseError:
                pass
        return feature.present

    def close_kept(self) -> None:
        """Return the calling thread's kept connection to the pool."""
        conn = getattr(self._kept, "conn", None)
        self._kept.conn = None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    @contextlib.contextmanager
    def transaction(self, action: str) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                try:
                    with conn.begin():
                        yield conn
                except CONNECTION_ERRORS:
                    conn.invalidate()
                    raise
        except DB_ERRORS as exc:
            self.down(action, exc)
            raise DatabaseError(f"{action}: {describe(exc)}") from exc
        self.up(action)

    def down(self, action: str, exc: BaseException) -> None:
        """A statement failed for the database: said when the outage begins or changes kind,
        then once a minute while it lasts (every thread's failures count towards one report).
        A deadlock or serialization failure is no outage: the database answered, and the caller
        tries the work again; said apart (``database_conflict``), once a minute."""
        self._answered.clear()
        if conflicts(exc):
            with self._lock:
                notice = self._conflicts.failed(action, exc, clock.monotonic())
            if notice is not None:
                log.warning("database conflict, tried again: while=%s error=%s (%d in %.0fs; "
                            "said once a minute while it repeats)", action, describe(exc),
                            notice.failures, notice.lasted, extra={"action": "database_conflict"})
            return
        if refuses_writes(exc):
            with self._lock:
                self._refused_actions.add(action)
                notice = self._refused.failed(clock.monotonic(), kind_of(describe(exc)))
            if notice is not None and notice.first:
                log.warning("database refuses writes: while=%s error=%s (said again each minute "
                            "while it lasts)", action, describe(exc),
                            extra={"action": "database_unavailable"})
            elif notice is not None:
                log.warning("database still refuses writes: for=%.0fs failures=%d while=%s "
                            "error=%s", notice.lasted, notice.failures, action, describe(exc),
                            extra={"action": "database_unavailable"})
            return
        with self._lock:
            if isinstance(exc, CONNECTION_ERRORS):
                self._broken += 1
            notice = self._outage.failed(clock.monotonic(), kind_of(describe(exc)))
        if notice is None:
            return
        if notice.first:
            log.warning("database unavailable: while=%s error=%s (said again each minute while "
                        "it lasts)", action, describe(exc), extra={"action": "database_unavailable"})
        else:
            log.warning("database still unavailable: for=%.0fs failures=%d while=%s error=%s",
                        notice.lasted, notice.failures, action, describe(exc),
                        extra={"action": "database_unavailable"})

    def up(self, action: str) -> None:
        if self._refused.down and action in self._refused_actions:
            with self._lock:
                refused = self._refused.recovered(clock.monotonic())
                self._refused_actions.clear()
            self._answered.set()
            if refused is not None:
                log.warning("database accepts writes again: after=%.1fs failures=%d while=%s",
                            refused.lasted, refused.failures, action,
                            extra={"action": "database_reconnected"})
        if not self._outage.down:  # the common case, without the lock
            return
        with self._lock:
            notice = self._outage.recovered(clock.monotonic())
        self._answered.set()
        if notice is not None:
            log.warning("database reconnected: after=%.1fs failures=%d", notice.lasted,
                        notice.failures, extra={"action": "database_reconnected"})

    @property
    def is_down(self) -> bool:
        return self._outage.down

    def wait_answer(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds, less when a statement of any thread succeeds after
        the last failure: the recorder retries its kept endings the moment the database is
        seen to answer again (the supervisor's heartbeat tries every second while it is away)."""
        self._answered.wait(timeout)

    def until_done(self, action: str, stopping: threading.Event,
                   work: Callable[[Connection], None]) -> bool:
        """Run ``work`` in a transaction, again after a backoff while the database is down,
        until it commits (True) or ``stopping`` is set (False): how a worker or relay
        registers itself at start."""
        backoff = ReconnectBackoff(cap=RECONNECT_CAP)
        while not stopping.is_set():
            try:
                with self.transaction(action) as conn:
                    work(conn)
                return True
            except DatabaseError:
                stopping.wait(backoff.next())
        return False

    def reap_expired(self, logger: logging.Logger, restart_grace: float | None = None) -> None:
        """Hand back the jobs whose holder stopped renewing its lease (any worker's or relay's):
        the step every lease holder takes on its reap interval. ``restart_grace``: the
        reaper's lease margin (``outbox_reap_expired``; None: the default margin)."""
        from cronkeeper.db.outbox_claims import RESTART_GRACE, outbox_reap_expired

        note = self.has(self.notes)
        with self.statement("reaping expired leases") as conn:
            n = outbox_reap_expired(conn, restart_grace=RESTART_GRACE if restart_grace is None
                                    else restart_grace, note=note)
        if n:
            logger.warning("leases expired: jobs=%d", n, extra={"action": "leases_expired"})


# The longest a lease holder's claim loop (and its registration) waits between two tries while
# the database is away, as the daemon's session loop: it resumes within seconds of the
# database healing, whatever the outage lasted. A failed try costs the server one refused
# connection.
RECONNECT_CAP = 5.0


class ReconnectBackoff:
    """Reconnect delays: 0.5 s doubling to ``cap`` (30 s unless told), reset on success."""

    def __init__(self, first: float = 0.5, cap: float = 30.0) -> None:
        self.first, self.cap, self.current = first, cap, 0.0

    def next(self) -> float:
        self.current = self.first if self.current == 0 else min(self.cap, self.current * 2)
        return self.current

    def reset(self) -> None:
        self.current = 0.0
