"""cronkeeper worker: consume the outbox (§7)."""

from __future__ import annotations

import logging
import os
import signal
import threading

import click

from cronkeeper import __version__, logs
from cronkeeper.cli import notify
from cronkeeper.cli.common import database_options, serve_metrics
from cronkeeper.errors import UsageError

log = logging.getLogger("cronkeeper.worker")


def parse_limits(values: tuple[str, ...]) -> dict[str, int]:
    limits: dict[str, int] = {}
    for value in values:
        name, sep, count = value.rpartition("=")
        if not sep or not name or not count.isdigit() or int(count) < 1:
            raise UsageError(f"--limit {value!r}: expected TASK=N with N >= 1")
        limits[name] = int(count)
    return limits


# The worker's own threads that hold or take a pooled connection beside its runners (each of
# which may hold one for a handler's transaction, a command's version, an output written
# apart): the claim loop and the recorder keep one each, the supervisor takes one to heartbeat,
# and one to spare (the drain, the reaper). A pool smaller than that made the runners and the
# supervisor wait for each other: ten handlers holding their transactions 30 s starved the
# heartbeat until the pool's timeout ended the supervisor thread. The 5 the pool opens for a
# moment beyond it cover the rest (a metrics scrape; an abandoned handler thread still holding
# its transaction). Idle connections stay open: a worker keeps at most this many.
OWN_CONNECTIONS = 4


def parse_output_limit(value: str) -> int:
    from cronkeeper.schedule.model import MAX_OUTPUT_LIMIT
    from cronkeeper.schedule.values import size

    result = size("--output-limit", value, high=MAX_OUTPUT_LIMIT)
    if isinstance(result, str):
        raise UsageError(result)
    return result


def default_worker_id() -> str:
    import socket
    import uuid

    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@click.command("worker")
@database_options
@click.option("--schedules", "schedules_dir", envvar="CRONKEEPER_SCHEDULES", default=None,
              type=click.Path(file_okay=True, dir_okay=True),
              help="Schedule files: the ONLY source of commands this worker runs.")
@click.option("--import", "imports", multiple=True, envvar="CRONKEEPER_WORKER_IMPORTS",
              help="Module whose @task decorators register handlers (repeatable).")
@click.option("--concurrency", type=click.IntRange(1, 10000), default=10, show_default=True,
              envvar="CRONKEEPER_WORKER_CONCURRENCY", help="Jobs run at once.")
@click.option("--batch-size", type=click.IntRange(1, 10000), default=250, show_default=True,
              help="Most jobs claimed per statement.")
@click.option("--task", "tasks", multiple=True, help="Only jobs of this task (repeatable).")
@click.option("--schedule", "schedule_names", multiple=True,
              help="Only jobs of this schedule (repeatable).")
@click.option("--limit", "limits", multiple=True, metavar="TASK=N",
              help="At most N jobs of TASK at once on this worker (repeatable).")
@click.option("--drain-timeout", type=click.FloatRange(0), default=30.0, show_default=True,
              envvar="CRONKEEPER_DRAIN_TIMEOUT",
              help="On SIGTERM, seconds running jobs may finish before they are killed and released.")
@click.option("--lease-margin", type=click.FloatRange(0.2), default=30.0, show_default=True,
              help="Lease = job timeout + this; heartbeats keep it this far ahead.")
@click.option("--poll-interval", type=click.FloatRange(0.01), default=1.0, show_default=True,
              help="Longest pause between claims when nothing is due (a fallback: idle "
                   "workers are woken by LISTEN/NOTIFY and at the next job's run_after).")
@click.option("--kill-grace", type=click.FloatRange(0), default=2.0, show_default=True,
              help="Seconds between SIGTERM and SIGKILL of a timed-out command's (or handler "
                   "process's) group; how long a cancelled async handler may take to stop.")
@click.option("--isolation", type=click.Choice(["thread", "process"]), default="thread",
              show_default=True, envvar="CRONKEEPER_WORKER_ISOLATION",
              help="Where task handlers run: threads of the worker, or pooled child processes "
                   "killed (with everything they started) at the job's timeout.")
@click.option("--max-jobs-per-child", type=click.IntRange(0), default=1000, show_default=True,
              envvar="CRONKEEPER_WORKER_MAX_JOBS_PER_CHILD",
              help="Process isolation: recycle a handler process after this many jobs (0: never).")
@click.option("--max-child-memory", "max_child_memory", type=click.IntRange(0), default=512,
              show_default=True, metavar="MIB", envvar="CRONKEEPER_WORKER_MAX_CHILD_MEMORY",
              help="Process isolation: recycle a handler process whose resident memory passes "
                   "this many MiB after a job (0: never).")
@click.option("--output-limit", envvar="CRONKEEPER_WORKER_OUTPUT_LIMIT", default="64KiB",
              show_default=True, metavar="SIZE",
              help="Output kept per attempt of an enqueued job (one of no schedule): a size "
                   "like 64KiB, at most 1MiB; 0B keeps nothing. A schedule's own output_limit "
                   "applies to its jobs, runtime schedules and files this worker lacks too.")
@click.option("--instance-id", envvar="CRONKEEPER_INSTANCE_ID", default=None,
              help="Default: host, pid and a random suffix.")
@click.option("--metrics-address", envvar="CRONKEEPER_WORKER_METRICS_ADDRESS",
              default="127.0.0.1:9465", show_default=True,
              help="HOST:PORT for Prometheus metrics, or 'off' (env "
                   "CRONKEEPER_WORKER_METRICS_ADDRESS; 9465, next to the scheduler's 9464).")
@click.option("--log-format", envvar="CRONKEEPER_LOG_FORMAT", type=click.Choice(["text", "json"]),
              default="text", show_default=True)
@click.option("--log-level", envvar="CRONKEEPER_LOG_LEVEL",
              type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@notify.notify_options
def worker_command(
    database_url: str | None, schema: str, cluster: str, schedules_dir: str | None,
    imports: tuple[str, ...], concurrency: int, batch_size: int, tasks: tuple[str, ...],
    schedule_names: tuple[str, ...], limits: tuple[str, ...], drain_timeout: float,
    lease_margin: float, poll_interval: float, kill_grace: float, isolation: str,
    max_jobs_per_child: int, max_child_memory: int, output_limit: str, instance_id: str | None,
    metrics_address: str, log_format: str, log_level: str, notify_config: str | None,
    web_url: str | None,
) -> None:
    """Claim jobs from the outbox and run them; SIGTERM drains."""
    from cronkeeper.cli.connect import open_database
    from cronkeeper.db.migrate import PREVIOUS_RELEASE_SCHEMA
    from cronkeeper.worker.commands import load_specs
    from cronkeeper.worker.loop import Worker, say_if_pid_one
    from cronkeeper.worker.registry import import_modules
    from cronkeeper.worker.runtime import WorkerConfig

    logs.configure(log_format, log_level)
    notes = notify.load(notify_config, web_url)
    parsed_limits = parse_limits(limits)
    output_bytes = parse_output_limit(output_limit)
    specs, digest = load_specs(schedules_dir)
    import_modules(list(imports))
    database = open_database(database_url, schema, application_name="cronkeeper-worker", wait=True,
                             schema_needed=PREVIOUS_RELEASE_SCHEMA,
                             pool_size=concurrency + OWN_CONNECTIONS)
    if database.embedded:
        log.warning("embedded database: no --database-url; this worker uses the embedded "
                    "PostgreSQL (single node)", extra={"action": "embedded_database"})
    config = WorkerConfig(
        worker_id=instance_id or default_worker_id(), cluster=cluster, schema=schema,
        concurrency=concurrency, batch_size=batch_size, tasks=list(tasks) or None,
        schedules=list(schedule_names) or None, limits=parsed_limits, lease_margin=lease_margin,
        poll_interval=poll_interval, drain_timeout=drain_timeout, kill_grace=kill_grace,
        isolation=isolation, max_jobs_per_child=max_jobs_per_child,
        max_child_memory_mb=max_child_memory, imports=list(imports), specs=specs, schedules_digest=digest, version=__version__,
        output_limit=output_bytes,
    )
    serve_metrics(metrics_address, "worker", engine=database.engine, cluster=cluster)
    worker = Worker(database.engine, config)
    signals = {"count": 0}

    def on_signal(signum: int, frame: object) -> None:
        signals["count"] += 1
        worker.stop(immediate=signals["count"] > 1)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sender = notify.start_sender(database.engine, notes, schema=schema,
                                 sender_id=config.worker_id, web_url=web_url)
    say_if_pid_one()
    code = worker.run()
    if sender is not None:
        sender.stop()
    database.engine.dispose()
    alive = [t for t in threading.enumerate() if t.name.startswith("job") and t.is_alive()]
    if alive:
        # Abandoned handler threads (timed out or released) cannot be joined: leave now.
        logging.shutdown()
        os._exit(code)
    raise SystemExit(code)

