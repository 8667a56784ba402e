"""Options and rendering shared by the commands."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from cronkeeper.spec.diagnostics import safe  # the one escaping helper

__all__ = ["database_options", "format_option", "safe"]


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


def format_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="Output format.",
    )(func)
