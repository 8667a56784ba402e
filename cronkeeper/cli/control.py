"""Operator commands: pause, resume, trigger, backfill. They write through the same statements
as the leader; backfill claims periods under the same unique constraint, so it never
duplicates a period that has an outcome."""

from __future__ import annotations

import difflib
import getpass
import itertools
import json
from datetime import datetime

import click

from cronkeeper.cli.common import database_options, safe
from cronkeeper.cli.connect import open_database
from cronkeeper.db import scheduling as dbs
from cronkeeper.db.engine import driver, translate_errors
from cronkeeper.errors import CronkeeperError, UsageError
from cronkeeper.planning import Decision, Outcome, Reason
from cronkeeper.scheduler import period_row, stored_spec
from cronkeeper.timing import TimingError, parse_instant

BACKFILL_LIMIT = 100_000
OPERATOR_TERM = 0  # periods written by operator commands carry term 0


def _who() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name is not an error
        return "unknown"


def _live_version(raw, name: str) -> dbs.VersionRow:
    versions = dbs.versions_in_force(raw)
    live = {v.schedule: v for v in versions if v.spec is not None}
    if name in live:
        return live[name]
    hint = difflib.get_close_matches(name, list(live), n=1)
    suffix = f"; did you mean {hint[0]!r}?" if hint else ""
    if any(v.schedule == name for v in versions):
        raise CronkeeperError(f"schedule {safe(name)!r} was removed from the schedule files{suffix}")
    raise CronkeeperError(
        f"no schedule {safe(name)!r} is known to the cluster (a leader records schedules "
        f"when it loads them){suffix}"
    )


def _parse_instant(value: str, option: str) -> datetime:
    try:
        return parse_instant(value)
    except TimingError as exc:
        raise UsageError(f"{option}: {exc}") from None


def set_paused(engine, name: str, paused: bool, who: str) -> None:
    """Pause or resume a schedule that is in force (``pause``, ``resume`` and the web)."""
    with translate_errors("updating the schedule"), engine.begin() as conn:
        raw = driver(conn)
        _live_version(raw, name)
        dbs.controls_set(raw, name, paused, who)


def trigger_job(engine, name: str) -> tuple[int, str]:
    """Write one manual job for a schedule now: (job id, idempotency key)."""
    with translate_errors("writing the job"), engine.begin() as conn:
        raw = driver(conn)
        version = _live_version(raw, name)
        spec, _ = stored_spec(version)
        now = dbs.db_now(raw)
        row = period_row(spec, version.id, Decision(now, Outcome.EMITTED))
        key = f"{spec.name}@manual:{now.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"
        row = row._replace(key=key, run_after=now)  # PeriodRow is a NamedTuple
        return dbs.outbox_insert_manual(raw, row), key


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
    if until <= after:
        raise UsageError("--to must be later than --from")
    db = open_database(database_url, schema)
    with translate_errors("backfilling"), db.engine.begin() as conn:
        raw = driver(conn)
        _live_version(raw, name)
        now = dbs.db_now(raw)
        until = min(until, now)  # a period is never decided before it is due
        rows = []
        versions = dbs.versions_history(raw, name)
        decided = dbs.periods_decided(raw, name, after, until)
        for version, following in itertools.zip_longest(versions, versions[1:]):
            if version.spec is None:
                continue
            spec, trigger = stored_spec(version)
            lo = max(after, version.active_from)
            hi = min(until, following.active_from) if following else until
            if hi <= lo:
                continue
            for period in trigger.fires(lo, hi):
                if period not in decided:
                    rows.append(period_row(spec, version.id, Decision(period, Outcome.EMITTED, Reason.BACKFILL)))
                if len(rows) > BACKFILL_LIMIT:
                    raise UsageError(f"more than {BACKFILL_LIMIT} periods: backfill a shorter window")
        claimed = [] if dry_run else dbs.periods_claim(raw, rows, OPERATOR_TERM)
    periods = [r.scheduled_for for r in rows] if dry_run else [c[1] for c in claimed]
    if fmt == "json":
        click.echo(json.dumps({
            "schedule": name, "dry_run": dry_run,
            "periods": [p.strftime("%Y-%m-%dT%H:%M:%SZ") for p in sorted(periods)],
        }))
        return
    verb = "would emit" if dry_run else "emitted"
    click.echo(f"{verb} {len(periods)} period(s) of {safe(name)!r} with no outcome yet")
    for p in sorted(periods):
        click.echo(f"  {p.strftime('%Y-%m-%dT%H:%M:%SZ')}")
