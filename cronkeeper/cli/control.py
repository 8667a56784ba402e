"""Operator commands: pause, resume, trigger, backfill, parsed and rendered here; what each does
is ``cronkeeper.operations.control``, which the web's actions call too."""

from __future__ import annotations

import getpass
import json
from datetime import datetime

import click

from cronkeeper.cli.common import database_options, safe
from cronkeeper.cli.connect import open_database
from cronkeeper.errors import UsageError
from cronkeeper.operations.control import backfill, check_window, set_paused, trigger_job
from cronkeeper.timing import TimingError, parse_instant


def _who() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name is not an error
        return "unknown"


def _parse_instant(value: str, option: str) -> datetime:
    try:
        return parse_instant(value)
    except TimingError as exc:
        raise UsageError(f"{option}: {exc}") from None


def _set_paused(database_url, schema, name: str, paused: bool) -> None:
    db = open_database(database_url, schema)
    set_paused(db.engine, name, paused, _who())
    state = "paused: its periods are recorded as skipped (paused)" if paused else "resumed"
    click.echo(f"schedule {safe(name)!r} {state}")


@click.command("pause")
@database_options
@click.argument("name")
def pause_command(database_url, schema, cluster, name) -> None:
    """Pause a schedule: periods due while paused are recorded as skipped (paused)."""
    _set_paused(database_url, schema, name, True)


@click.command("resume")
@database_options
@click.argument("name")
def resume_command(database_url, schema, cluster, name) -> None:
    """Resume a paused schedule (from its next period on)."""
    _set_paused(database_url, schema, name, False)


@click.command("trigger")
@database_options
@click.argument("name")
def trigger_command(database_url, schema, cluster, name) -> None:
    """Write one manual job for a schedule now (no period is claimed)."""
    db = open_database(database_url, schema)
    job_id, key = trigger_job(db.engine, name)
    click.echo(f"job {job_id} written for {safe(name)!r} (idempotency key {key})")


@click.command("backfill")
@database_options
@click.argument("name")
@click.option("--from", "start", required=True, help="ISO instant; periods strictly after it.")
@click.option("--to", "end", required=True, help="ISO instant; periods up to and including it.")
@click.option("--dry-run", is_flag=True, help="List the periods without writing anything.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def backfill_command(database_url, schema, cluster, name, start, end, dry_run, fmt) -> None:
    """Emit the periods of NAME in (--from, --to] that have no outcome yet."""
    after = _parse_instant(start, "--from")
    until = _parse_instant(end, "--to")
    check_window(after, until)  # before connecting: a usage error needs no database
    db = open_database(database_url, schema)
    periods = backfill(db.engine, name, after, until, dry_run=dry_run)
    if fmt == "json":
        click.echo(json.dumps({
            "schedule": name, "dry_run": dry_run,
            "periods": [p.strftime("%Y-%m-%dT%H:%M:%SZ") for p in periods],
        }))
        return
    verb = "would emit" if dry_run else "emitted"
    click.echo(f"{verb} {len(periods)} period(s) of {safe(name)!r} with no outcome yet")
    for p in periods:
        click.echo(f"  {p.strftime('%Y-%m-%dT%H:%M:%SZ')}")
