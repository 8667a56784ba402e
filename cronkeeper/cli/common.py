"""Options and rendering shared by the commands."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import click

from cronkeeper.errors import UsageError
from cronkeeper.schedule.diagnostics import safe  # the one escaping helper

__all__ = [
    "config_or_exit", "database_options", "format_option", "parse_metrics_address", "safe", "serve_metrics",
    "start_metrics",
]


def database_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--database-url, --schema and --cluster, each also read from the environment (§6)."""

    @click.option(
        "--database-url",
        envvar="CRONKEEPER_DATABASE_URL",
        default=None,
        help="postgresql:// URL (env CRONKEEPER_DATABASE_URL). Unset: the embedded PostgreSQL.",
    )
    @click.option(
        "--schema",
        envvar="CRONKEEPER_SCHEMA",
        default="cronkeeper",
        show_default=True,
        help="Schema holding cronkeeper's tables (env CRONKEEPER_SCHEMA).",
    )
    @click.option(
        "--cluster",
        envvar="CRONKEEPER_CLUSTER",
        default="default",
        show_default=True,
        help="Instances of one cluster elect one leader (env CRONKEEPER_CLUSTER).",
    )
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)

    return wrapper


def config_or_exit(result: Any, what: str, logger: logging.Logger) -> Any:
    """A checked config file's value (a relay or notify ``ConfigResult``): its warnings logged
    (``action=<what>_config_warning``), or a UsageError listing every error as file:line."""
    for warning in result.warnings:
        logger.warning("%s config: %s", what, warning.render(),
                       extra={"action": f"{what}_config_warning"})
    if result.config is None:
        raise UsageError(f"{what} config is invalid:\n" + "\n".join(
            f"  {d.render()}" for d in result.errors))
    return result.config


def format_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="Output format.",
    )(func)


def serve_metrics(address: str, kind: str, *, engine, cluster: str) -> None:
    """Serve a consumer's metrics (worker, relay) unless ``address`` is ``off``. A port that
    cannot be bound is logged, not fatal: metrics must not stop the process that does the work.
    A malformed address is the user's to fix (UsageError)."""
    if address.strip().lower() == "off":
        return
    try:
        start_metrics(address, kind, engine=engine, cluster=cluster)
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - metrics must not stop the worker or relay
        logging.getLogger(f"cronkeeper.{kind}").warning(
            "metrics unavailable: error=%s", exc, extra={"action": "metrics_unavailable"}
        )


def parse_metrics_address(value: str) -> tuple[str, int] | None:
    if value.strip().lower() == "off":
        return None
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--metrics-address {value!r}: expected HOST:PORT or 'off'")
    return host.strip("[]") or "127.0.0.1", int(port)


def start_metrics(address: str, kind: str, engine=None, cluster: str = "default"):
    """Serve metrics on ``address`` (or not, for 'off'). With an engine, queue and fleet
    figures are read from the database on each scrape."""
    bind = parse_metrics_address(address)
    if bind is None:
        return None
    from cronkeeper import metrics  # noqa: PLC0415 - only when served

    return metrics.serve(bind, kind=kind, engine=engine, cluster=cluster)
