"""Who watches the watcher: the leader pings ``heartbeat_url`` (HTTP GET) every
``heartbeat_interval``, so a dead man's switch outside (healthchecks.io, Cronitor) raises the
alarm when no instance leads, or the one that leads makes no progress.

The leader's loop (``leading.LeaderLoop``) calls ``beat()`` after each tick it committed; a ping
is sent when the interval has passed since the last one. The GET itself runs on this object's
thread, so a slow or unreachable URL never holds a tick (nor trips the stall watchdog). A
standby never beats, a leader whose loop is stuck stops beating, and a stopped fleet sends
nothing: the switch fires. Failed pings are logged when they begin failing and once a minute
while they go on (``cronkeeper.outage``), and counted (``cronkeeper_heartbeat_pings_total``).
"""

from __future__ import annotations

import logging
import threading

from cronkeeper import clock, metrics
from cronkeeper.notify.sinks import SendError, get
from cronkeeper.outage import OutageReport, kind_of

log = logging.getLogger("cronkeeper.notify")

TIMEOUT = 10.0


class Pinger:
    def __init__(self, url: str, interval: float, *, instance: str = "",
                 timeout: float = TIMEOUT) -> None:
        self.url = url
        # Says which instance pinged (X-Cronkeeper-Instance): the services ignore it; a log
        # of the pings shows the leader of the moment.
        self.headers = {"X-Cronkeeper-Instance": instance} if instance else {}
        self.interval = interval
        self.timeout = min(timeout, max(interval, 1.0))
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._next = 0.0
        self._failing = OutageReport()
        self.thread = threading.Thread(target=self._run, name="heartbeat-ping", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._due.set()

    def beat(self) -> None:
        """The leader made progress: ping if the interval has passed (never blocks)."""
        now = clock.monotonic()
        if now >= self._next:
            self._next = now + self.interval
            self._due.set()

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._stopping.is_set():
                return
            try:
                get(self.url, self.timeout, self.headers)
            except SendError as exc:
                metrics.current().heartbeat_ping(False)
                notice = self._failing.failed(clock.monotonic(), kind_of(str(exc)))
                if notice is not None:
                    log.warning("heartbeat ping failed: %s%s", exc, "" if notice.first else
                                f" (for {notice.lasted:.0f}s, {notice.failures} pings)",
                                extra={"action": "heartbeat_ping_failed"})
                continue
            metrics.current().heartbeat_ping(True)
            back = self._failing.recovered(clock.monotonic())
            if back is not None:
                log.warning("heartbeat pings go through again after %.0fs", back.lasted,
                            extra={"action": "heartbeat_ping_restored"})
            log.debug("heartbeat pinged", extra={"action": "heartbeat_pinged"})
