"""cronkeeper run: the scheduler daemon (one of N instances; one leads)."""

from __future__ import annotations

import gc
import logging
import signal
import threading

import click

from cronkeeper import clock, logs, systemd
from cronkeeper.cli import companion
from cronkeeper.cli.common import database_options, start_metrics
from cronkeeper.cli.connect import open_database
from cronkeeper.db.engine import redact
from cronkeeper.election import Node, NodeOptions, Role, default_instance_id
from cronkeeper.errors import CronkeeperError, ScheduleError
from cronkeeper.schedule import load_valid
from cronkeeper.schedule.model import ScheduleSet

log = logging.getLogger("cronkeeper.run")


def load_schedules(path: str) -> ScheduleSet:
    """Load and validate; on errors raise ScheduleError, whose message lists every problem
    (the CLI prints it and exits 1)."""
    return load_valid([path], now=clock.wall())


def daemon_options(func):
    for option in reversed(
        [
            click.option("--schedules", "schedules_dir", envvar="CRONKEEPER_SCHEDULES",
                         required=True, type=click.Path(file_okay=True, dir_okay=True),
                         help="Directory of schedule files (env CRONKEEPER_SCHEDULES)."),
            click.option("--instance-id", envvar="CRONKEEPER_INSTANCE_ID", default=None,
                         help="Default: host, pid and a random suffix."),
            click.option("--metrics-address", envvar="CRONKEEPER_METRICS_ADDRESS",
                         default="127.0.0.1:9464", show_default=True,
                         help="HOST:PORT for Prometheus metrics, or 'off'."),
            click.option("--log-format", envvar="CRONKEEPER_LOG_FORMAT",
                         type=click.Choice(["text", "json"]), default="text", show_default=True),
            click.option("--log-level", envvar="CRONKEEPER_LOG_LEVEL",
                         type=click.Choice(["debug", "info", "warning", "error"]),
                         default="info", show_default=True),
        ]
    ):
        func = option(func)
    return func


@click.command("run")
@database_options
@daemon_options
@click.option("--migrate", "migrate_first", is_flag=True, envvar="CRONKEEPER_MIGRATE",
              help="Apply pending migrations before starting (the embedded database always does).")
@click.option("--leader-timeout", envvar="CRONKEEPER_LEADER_TIMEOUT", type=click.FloatRange(2, 300),
              default=10.0, show_default=True,
              help="Seconds without a leader heartbeat before a standby deposes it (frozen leader).")
@click.option("--stall-timeout", envvar="CRONKEEPER_STALL_TIMEOUT", type=click.FloatRange(1, 3600),
              default=10.0, show_default=True,
              help="Seconds a leader's tick may make no progress before it steps down.")
@click.option("--with-worker", is_flag=True,
              help="Also start a worker on the same schedules (a single-box trial).")
def run_command(
    database_url, schema, cluster, schedules_dir, instance_id, metrics_address, log_format,
    log_level, migrate_first, leader_timeout, stall_timeout, with_worker,
) -> None:
    """Run the scheduler daemon."""
    logs.configure(log_format, log_level)
    gc.disable()  # the loader makes no cycles; the set it makes lives as long as the process:
    try:  # frozen, the collector never walks it again (the leader's passes stay short)
        schedules = load_schedules(schedules_dir)
    finally:
        gc.freeze()
        gc.enable()
    db = open_database(database_url, schema, migrate_first=migrate_first,
                       application_name="cronkeeper-run", wait=True)
    instance_id = instance_id or default_instance_id()
    metrics = start_metrics(metrics_address, "scheduler", engine=db.engine, cluster=cluster)
    node = Node(
        url=db.url, schema=schema, cluster=cluster, engine=db.engine, schedules=schedules,
        instance_id=instance_id, metrics=metrics,
        options=NodeOptions(leader_timeout=leader_timeout, stall_timeout=stall_timeout),
    )
    log.info(
        "starting instance %s: %d schedules, database %s, schema %s, cluster %s",
        instance_id, len(schedules.specs), redact(db.url), schema, cluster,
        extra={"action": "start", "instance": instance_id},
    )
    reload_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: node.request_stop())
    signal.signal(signal.SIGINT, lambda *_: node.request_stop())
    signal.signal(signal.SIGHUP, lambda *_: reload_requested.set())
    thread = threading.Thread(target=node.run, name="node")
    thread.start()
    worker = companion.start_worker(db, cluster, schedules_dir) if with_worker else None
    ready = False
    watchdog = systemd.watchdog_interval()
    next_ping = 0.0
    while thread.is_alive():
        if ready:
            thread.join(0.2)
        elif node.connected.wait(0.2):  # READY=1 the moment the node has its connection
            systemd.notify("READY=1\nSTATUS=standby, waiting for leadership")
            ready = True
            # After READY=1: the set's digest (what instances compare) is 100,000 serialised
            # specs at that size, and no part of what READY=1 promises.
            log.info("ready: schedule set digest %s", schedules.digest,
                     extra={"action": "ready", "instance": instance_id})
        if reload_requested.is_set():
            reload_requested.clear()
            _reload(node, schedules_dir)
        if watchdog and clock.monotonic() >= next_ping and _healthy(node, stall_timeout):
            systemd.notify("WATCHDOG=1")
            next_ping = clock.monotonic() + watchdog
    systemd.notify("STOPPING=1")
    companion.stop_worker(worker)
    db.engine.dispose()
    if node.fatal is not None:
        raise node.fatal
    if not node.stopping.is_set():  # the node ended on its own: never report success
        raise CronkeeperError("the scheduler stopped unexpectedly; see the log above")
    log.info("stopped", extra={"action": "stop", "instance": instance_id})


def _reload(node: Node, schedules_dir: str) -> None:
    try:
        schedules = load_valid([schedules_dir], now=clock.wall())
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
    node.reload(schedules)


def _healthy(node: Node, stall_timeout: float) -> bool:
    if node.role is Role.LEADER:
        return clock.monotonic() - node.last_progress < stall_timeout
    return True
