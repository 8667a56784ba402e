"""The worker's LISTEN thread: a dedicated session LISTENs on the schema's wake channel (see
``cronkeeper/db/wake.py``) and pokes the claim loop on every notification, so an idle worker
claims a job within milliseconds of the commit that made it available.

The poll stays the safety net, never the only path: when the LISTEN session is lost (the
database restarted, the backend terminated, the network cut) the thread logs
``action=listen_lost``, reconnects with backoff, logs ``action=listen_restored`` and pokes the
loop once, so whatever was committed while nobody listened is claimed then (and, meanwhile, at
each poll). Behind a transaction-pooling proxy (PgBouncer, Supavisor) a LISTEN lives on a
backend the proxy hands to others, and notifications go astray: the thread checks at start
that its session keeps one backend across transactions (as the daemon does for its lock) and,
when it does not, says so (``action=listen_unavailable``) and leaves the worker to poll.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from cronkeeper import clock
from cronkeeper.claiming import ReconnectBackoff
from cronkeeper.db import wake as db_wake
from cronkeeper.db.engine import DRIVER_ERRORS, Engine, describe
from cronkeeper.db.sessions import session_is_pinned

log = logging.getLogger("cronkeeper.worker")

APPLICATION_NAME = "cronkeeper-worker-listen"  # how the session shows in pg_stat_activity
WAIT = 0.5  # seconds per wait for a notification: the longest a stop waits for this thread


class Wakeups:
    def __init__(self, engine: Engine, schema: str, poll_interval: float,
                 on_wake: Callable[[], None], stopping: threading.Event, *,
                 channel: str | None = None, who: str = "worker") -> None:
        """``channel``: another channel than the outbox's (the notification sender's, the
        leader's for runtime schedules); ``who``: what the log lines say is polling instead."""
        self.who = who
        self.engine = engine
        self.channel = channel or db_wake.wake_channel(schema)
        self.poll_interval = poll_interval
        self.on_wake = on_wake
        self.stopping = stopping
        self.listening = threading.Event()  # set while a LISTEN session is up (tests wait on it)
        self.thread = threading.Thread(target=self._run, name="listener", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        backoff = ReconnectBackoff()
        checked = False
        lost_since: float | None = None
        while not self.stopping.is_set():
            conn = None
            try:
                conn = db_wake.listen_connect(self.engine.url, APPLICATION_NAME)
                if not checked:
                    if not self._pinned(conn):
                        log.warning(
                            "wake-ups unavailable: the database connection does not keep one "
                            "backend across transactions, so a transaction-pooling proxy "
                            "(PgBouncer, Supavisor) sits in between and LISTEN/NOTIFY cannot "
                            "work through it; this %s polls every %gs instead. Point "
                            "--database-url at PostgreSQL directly (or a session-pooling port) "
                            "for millisecond pickup.", self.who, self.poll_interval,
                            extra={"action": "listen_unavailable"})
                        return
                    checked = True
                db_wake.listen(conn, self.channel)
                self.listening.set()
                if lost_since is not None:
                    log.warning("wake-ups restored: channel=%s after=%.1fs", self.channel,
                                clock.monotonic() - lost_since, extra={"action": "listen_restored"})
                    lost_since = None
                backoff.reset()
                self.on_wake()  # whatever committed while nobody listened
                while not self.stopping.is_set():
                    if db_wake.notified(conn, WAIT):
                        self.on_wake()
            except DRIVER_ERRORS as exc:
                self.listening.clear()
                if lost_since is None:
                    lost_since = clock.monotonic()
                    log.warning("wake-ups lost: channel=%s error=%s: polling every %gs until "
                                "the LISTEN session is back", self.channel, describe(exc),
                                self.poll_interval, extra={"action": "listen_lost"})
                self.stopping.wait(backoff.next())
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
        self.listening.clear()

    def _pinned(self, conn) -> bool:  # noqa: ANN001 - a driver connection, named in db/ only
        probe = db_wake.listen_connect(self.engine.url, APPLICATION_NAME + "-probe")
        try:
            return session_is_pinned(conn, probe)
        finally:
            probe.close()
