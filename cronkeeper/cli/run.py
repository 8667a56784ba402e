"""cronkeeper run: the scheduler daemon (one of N instances; one leads)."""

from __future__ import annotations

import logging
import signal

import click

from cronkeeper import logs
from cronkeeper.cli import companion, notify
from cronkeeper.cli.common import database_options, start_metrics
from cronkeeper.cli.connect import open_database
from cronkeeper.daemon import Daemon, check_no_runtime_conflicts, load_schedules
from cronkeeper.db.engine import redact
from cronkeeper.election import NodeOptions
from cronkeeper.instance import default_instance_id

log = logging.getLogger("cronkeeper.run")


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
@notify.notify_options
def run_command(
    database_url, schema, cluster, schedules_dir, instance_id, metrics_address, log_format,
    log_level, migrate_first, leader_timeout, stall_timeout, with_worker, notify_config,
    web_url,
) -> None:
    """Run the scheduler daemon."""
    logs.configure(log_format, log_level)
    notes = notify.load(notify_config, web_url)
    schedules = load_schedules(schedules_dir)
    db = open_database(database_url, schema, migrate_first=migrate_first,
                       application_name="cronkeeper-run", wait=True)
    check_no_runtime_conflicts(db.engine, schema, schedules)
    instance_id = instance_id or default_instance_id()
    metrics = start_metrics(metrics_address, "scheduler", engine=db.engine, cluster=cluster)
    pinger = notify.pinger(notes, instance_id)
    daemon = Daemon(
        url=db.url, schema=schema, cluster=cluster, engine=db.engine, schedules=schedules,
        schedules_dir=schedules_dir, instance_id=instance_id, metrics=metrics,
        options=NodeOptions(leader_timeout=leader_timeout, stall_timeout=stall_timeout),
        pinger=pinger, audit_missing=notes is not None,
    )
    log.info(
        "starting instance %s: %d schedules, database %s, schema %s, cluster %s",
        instance_id, len(schedules.specs), redact(db.url), schema, cluster,
        extra={"action": "start", "instance": instance_id},
    )
    signal.signal(signal.SIGTERM, lambda *_: daemon.request_stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.request_stop())
    signal.signal(signal.SIGHUP, lambda *_: daemon.request_reload())
    daemon.start()
    sender = notify.start_sender(db.engine, notes, schema=schema, sender_id=instance_id,
                                 web_url=web_url)
    worker = companion.start_worker(db, cluster, schedules_dir) if with_worker else None
    daemon.supervise()
    companion.stop_worker(worker)
    if sender is not None:
        sender.stop()
    if pinger is not None:
        pinger.stop()
    db.engine.dispose()
    daemon.check_ended()
    log.info("stopped", extra={"action": "stop", "instance": instance_id})
