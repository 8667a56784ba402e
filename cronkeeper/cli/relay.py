"""cronkeeper relay: publish routed outbox jobs into the queue a team already runs (docs/relay.md)."""

from __future__ import annotations

import importlib
import logging
import signal

import click

from cronkeeper import logs
from cronkeeper.cli.common import config_or_exit, database_options, safe, serve_metrics
from cronkeeper.errors import UsageError

log = logging.getLogger("cronkeeper.relay")


def default_relay_id() -> str:
    import os
    import socket
    import uuid

    return f"{socket.gethostname()}-relay-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def load_config(path: str):
    """The relay config, or a UsageError listing every problem as ``file:line: message``."""
    from cronkeeper.relay.config import load_relay_config

    return config_or_exit(load_relay_config(path), "relay", log)


def build_targets(config) -> dict:
    from cronkeeper.relay.targets import KINDS

    targets = {}
    for target in config.targets:
        try:
            module = importlib.import_module(KINDS[target.kind])
        except ImportError as exc:
            raise UsageError(f"target {safe(target.name)}: kind {target.kind!r} is not available "
                             f"in this installation ({exc}); install 'cronkeeper[{target.kind}]'") from exc
        targets[target.name] = module.build(target.name, target.as_dict())
    return targets


@click.command("relay")
@database_options
@click.option("--config", "config_path", envvar="CRONKEEPER_RELAY_CONFIG", required=True,
              type=click.Path(exists=True, dir_okay=False),
              help="The relay config (targets and routes; env CRONKEEPER_RELAY_CONFIG).")
@click.option("--instance-id", envvar="CRONKEEPER_INSTANCE_ID", default=None,
              help="Default: host, 'relay', pid and a random suffix.")
@click.option("--metrics-address", envvar="CRONKEEPER_RELAY_METRICS_ADDRESS",
              default="127.0.0.1:9466", show_default=True,
              help="HOST:PORT for Prometheus metrics, or 'off' (env "
                   "CRONKEEPER_RELAY_METRICS_ADDRESS).")
@click.option("--log-format", envvar="CRONKEEPER_LOG_FORMAT", type=click.Choice(["text", "json"]),
              default="text", show_default=True)
@click.option("--log-level", envvar="CRONKEEPER_LOG_LEVEL",
              type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def relay_command(
    database_url: str | None, schema: str, cluster: str, config_path: str,
    instance_id: str | None, metrics_address: str, log_format: str, log_level: str,
) -> None:
    """Claim routed jobs, publish them to their targets, mark them published; SIGTERM stops."""
    from cronkeeper.cli.connect import open_database
    from cronkeeper.db.migrate import PREVIOUS_RELEASE_SCHEMA
    from cronkeeper.relay.loop import Relay

    logs.configure(log_format, log_level)
    config = load_config(config_path)
    targets = build_targets(config)
    database = open_database(database_url, schema, application_name="cronkeeper-relay",
                             wait=True, schema_needed=PREVIOUS_RELEASE_SCHEMA)
    if database.embedded:
        log.warning("embedded database: no --database-url; this relay uses the embedded "
                    "PostgreSQL (single node)", extra={"action": "embedded_database"})
    serve_metrics(metrics_address, "relay", engine=database.engine, cluster=cluster)
    relay = Relay(database.engine, config, targets, relay_id=instance_id or default_relay_id(),
                  schema=schema, cluster=cluster)

    def on_signal(signum: int, frame: object) -> None:
        relay.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = relay.run()
    database.engine.dispose()
    raise SystemExit(code)

