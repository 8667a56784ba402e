"""`cronkeeper schedules list|show|put|delete`: file and runtime schedules as the database holds
them, and runtime schedules changed from a file (docs/runtime-schedules.md). What each does is
``cronkeeper.operations.schedules``; this module parses and renders."""

from __future__ import annotations

import json

import click

from cronkeeper.cli.common import database_options, format_option, safe
from cronkeeper.cli.connect import open_database
from cronkeeper.errors import CronkeeperError
from cronkeeper.operations import schedules as ops


@click.group("schedules")
def schedules_command() -> None:
    """File and runtime schedules (runtime ones: cronkeeper.schedules, or `put` here)."""


@schedules_command.command("list")
@database_options
@click.option("--source", type=click.Choice(ops.SOURCES), default=None,
              help="Only the schedules from files, or only those defined at runtime.")
@format_option
def list_command(database_url, schema, cluster, source, fmt) -> None:
    """Every schedule, with its source (file or runtime)."""
    db = open_database(database_url, schema)
    items = ops.listing(db.engine, source)
    if fmt == "json":
        click.echo(json.dumps([{k: item[k] for k in (
            "name", "source", "version_id", "spec", "updated_at", "paused")} for item in items],
            indent=2))
        return
    if not items:
        click.echo("no schedules")
        return
    width = max(len(i["name"]) for i in items)
    for item in items:
        when = item["spec"].get("cron") or f"every {item['spec'].get('every')}"
        flags = "  paused" if item["paused"] else ""
        click.echo(f"{safe(item['name']).ljust(width)}  {item['source']:<7}  "
                   f"v{item['version_id']:<6}  {safe(when)}{flags}")


@schedules_command.command("show")
@database_options
@click.argument("name")
@format_option
def show_command(database_url, schema, cluster, name, fmt) -> None:
    """One schedule: its source, version and spec."""
    db = open_database(database_url, schema)
    item = ops.show(db.engine, name)
    if fmt == "json":
        click.echo(json.dumps(item, indent=2))
        return
    click.echo(f"schedule {safe(name)!r}: {item['source']}"
               + (f" ({safe(item['file'])})" if item.get("file") else "")
               + f", version {item['version_id']}, since {item['updated_at']}"
               + (", paused" if item["paused"] else ""))
    for key, value in sorted(item["spec"].items()):
        if value is not None:
            click.echo(f"  {key} = {safe(json.dumps(value))}")


@schedules_command.command("put")
@database_options
@click.argument("name")
@click.option("--from", "path", required=True, type=click.Path(dir_okay=False),
              help="A TOML file holding one schedule table, with or without its [NAME] header.")
def put_command(database_url, schema, cluster, name, path) -> None:
    """Create or replace the runtime schedule NAME from a file (validated as files are)."""
    db = open_database(database_url, schema)
    version, changed = ops.put_from_file(db.engine, schema, name, path)
    what = "written" if changed else "unchanged (the same spec): nothing written"
    click.echo(f"runtime schedule {safe(name)!r} {what}, version {version}")


@schedules_command.command("delete")
@database_options
@click.argument("name")
def delete_command(database_url, schema, cluster, name) -> None:
    """Delete the runtime schedule NAME (no period after the commit is emitted)."""
    db = open_database(database_url, schema)
    if not ops.delete(db.engine, schema, name):
        raise CronkeeperError(f"no runtime schedule named {name!r}")
    click.echo(f"runtime schedule {safe(name)!r} deleted")
