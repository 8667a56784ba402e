"""One scheduler instance, as ``cronkeeper run`` starts it: the election (``election.Node``), the
leader's loop it hands each won term to (``leading.LeaderLoop``), and their supervision.

    Daemon.start()      the node's thread: elect, and lead while elected
    Daemon.supervise()  until the node ends: READY=1 once connected, WATCHDOG=1 while healthy,
                        the schedule files read again when asked (SIGHUP), STOPPING=1 at the end
    Daemon.check_ended  raises unless the node ended because it was asked to
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import TYPE_CHECKING

from cronkeeper import clock, systemd
from cronkeeper.db.engine import URL, Engine, translate_errors
from cronkeeper.db.runtime_schedules import runtime_live_among
from cronkeeper.db.wake import schedules_channel
from cronkeeper.election import Node, NodeOptions
from cronkeeper.errors import CronkeeperError, ScheduleError
from cronkeeper.leading import LeaderLoop
from cronkeeper.schedule import load_valid
from cronkeeper.schedule.diagnostics import Diagnostic
from cronkeeper.schedule.model import ScheduleSet
from cronkeeper.worker.wakeups import Wakeups

if TYPE_CHECKING:  # a Pinger is made only with a heartbeat_url (cli.notify.pinger)
    from cronkeeper.notify.heartbeat import Pinger

log = logging.getLogger("cronkeeper.run")


def load_schedules(path: str) -> ScheduleSet:
    """Load and validate; on errors raise ScheduleError, whose message lists every problem
    (the CLI prints it and exits 1)."""
    gc.disable()  # the loader makes no cycles; the set it makes lives as long as the process:
    try:  # frozen, the collector never walks it again (the leader's passes stay short)
        return load_valid([path], now=clock.wall())
    finally:
        gc.freeze()
        gc.enable()


def check_no_runtime_conflicts(engine: Engine, schema: str, schedules: ScheduleSet) -> None:
    """Names are one namespace across files and runtime (docs/runtime-schedules.md): a file set
    that defines a name a live runtime schedule holds is refused as an invalid set is
    (ScheduleError, each diagnostic naming the runtime schedule)."""
    by_name = schedules.by_name()
    with translate_errors("checking the schedule names against runtime schedules"), \
            engine.connect() as conn:
        held = runtime_live_among(conn, list(by_name), schema=schema)
        conn.rollback()
    if held:
        diagnostics = [Diagnostic(by_name[n].file, by_name[n].line, n, (
            f"the name is held by a runtime schedule (cronkeeper.schedules; see `cronkeeper "
            f"schedules show {n}`): names are one namespace across files and runtime; rename "
            "this one, or delete the runtime schedule first")) for n in held]
        raise ScheduleError(f"{len(held)} schedule name{'s' if len(held) != 1 else ''} held "
                            "at runtime:\n" + "\n".join(d.render() for d in diagnostics),
                            diagnostics)


class Daemon:
    def __init__(self, *, url: URL, schema: str, cluster: str, engine: Engine,
                 schedules: ScheduleSet, schedules_dir: str, instance_id: str,
                 options: NodeOptions, metrics=None, pinger: Pinger | None = None,
                 audit_missing: bool = False) -> None:
        self.schedules_dir = schedules_dir
        self.instance_id = instance_id
        self.loop = LeaderLoop(schedules, metrics=metrics, pinger=pinger,
                               audit_missing=audit_missing)
        self.node = Node(
            url=url, schema=schema, cluster=cluster, engine=engine, instance_id=instance_id,
            lead=self.loop.lead, schedules_digest=self.loop.digest, options=options,
            metrics=metrics,
        )
        self._thread = threading.Thread(target=self.node.run, name="node")
        self._reload_requested = threading.Event()
        self.engine = engine
        self.schema = schema
        # Runtime schedule changes (cronkeeper.schedules) NOTIFY at commit: the leader looks at
        # once (and every second without it: LeaderOptions.runtime_poll).
        self.listener = Wakeups(engine, schema, 1.0, self.loop.runtime_changed,
                                self.node.stopping, channel=schedules_channel(schema),
                                who="scheduler (runtime schedules)")

    # -- from signal handlers -------------------------------------------------------------------
    def request_stop(self) -> None:
        self.node.request_stop()
        self.loop.wake()

    def request_reload(self) -> None:
        self._reload_requested.set()

    # -- the process's main thread --------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self.listener.start()

    def supervise(self) -> None:
        """Until the node's thread ends: systemd's READY=1 the moment the node has its
        connection, WATCHDOG=1 while it is healthy, a reload when asked; STOPPING=1 at the end."""
        ready = False
        watchdog = systemd.watchdog_interval()
        next_ping = 0.0
        while self._thread.is_alive():
            if ready:
                self._thread.join(0.2)
            elif self.node.signals.connected.wait(0.2):
                systemd.notify("READY=1\nSTATUS=standby, waiting for leadership")
                ready = True
                # After READY=1: the set's digest (what instances compare) is 100,000 serialised
                # specs at that size, and no part of what READY=1 promises.
                log.info("ready: schedule set digest %s", self.loop.schedules.digest,
                         extra={"action": "ready", "instance": self.instance_id})
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self._reload()
            if watchdog and clock.monotonic() >= next_ping and self.node.healthy():
                systemd.notify("WATCHDOG=1")
                next_ping = clock.monotonic() + watchdog
        systemd.notify("STOPPING=1")

    def check_ended(self) -> None:
        """Raise what ended the node, unless it was asked to stop."""
        if self.node.fatal is not None:
            raise self.node.fatal
        if not self.node.stopping.is_set():  # the node ended on its own: never report success
            raise CronkeeperError("the scheduler stopped unexpectedly; see the log above")

    def _reload(self) -> None:
        try:
            schedules = load_valid([self.schedules_dir], now=clock.wall())
            check_no_runtime_conflicts(self.engine, self.schema, schedules)
        except ScheduleError as exc:
            for diag in exc.diagnostics:
                log.error("reload refused: %s", diag.render(), extra={"action": "reload_refused"})
            log.error("reload refused: the last good schedule set keeps running",
                      extra={"action": "reload_refused"})
            return
        except Exception as exc:  # noqa: BLE001 - a reload must never stop the daemon
            log.error("reload refused: %s", exc, extra={"action": "reload_refused"})
            return
        log.info("reloaded %d schedules (digest %s)", len(schedules.specs), schedules.digest,
                 extra={"action": "reload"})
        self.loop.reload(schedules)
