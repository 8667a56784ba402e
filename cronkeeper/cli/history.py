"""cronkeeper history [NAME...]: the missed-run audit (docs/observability.md), rendered; the
audit itself is ``cronkeeper.operations.history``.

Every period the spec in force implies in the window, joined to its recorded outcome and job.
Exit 1 when any period is missing (or, with ``--fail-on dead``, when any job is dead), so it can
run from monitoring. The shell: read versions and records (one range query per schedule), call
the pure ``cronkeeper.audit``, render.
"""

from __future__ import annotations

import gc
import sys

import click

from cronkeeper.audit import (
    DEFAULT_RETENTION_DAYS,
    Audit,
)
from cronkeeper.cli.common import database_options, format_option, safe
from cronkeeper.operations.history import collect, write_json


def _lag(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if abs(seconds) < 60:
        return f"{seconds:.1f}s"
    if abs(seconds) < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def render_table(result: Audit) -> str:
    """Readable in 80 columns: one block per schedule, then the summary."""
    out: list[str] = []
    header = f"  {'SCHEDULED FOR (UTC)':<19}  {'STATUS':<7}  {'REASON':<9}  {'LAG':>7}  {'JOB':<9}  ATT"
    current = None
    append = out.append
    for schedule, at, status, reason, _, lag, state, attempts in result.rows:
        if schedule != current:
            current = schedule
            if out:
                append("")
            append(f"{safe(schedule)[:78]}")
            append(header)
        append(
            f"  {at[:10]} {at[11:19]}  {status:<7}  {reason or '':<9}  {_lag(lag):>7}  "
            f"{state or '':<9}  {'' if attempts is None else attempts}"
        )
    if out:
        out.append("")
    out.append(f"{'SCHEDULE':<28} {'OWNER':<14} {'EMIT':>6} {'SKIP':>6} {'PEND':>5} {'MISS':>6} {'DEAD':>5}")
    for s in result.summary:
        out.append(
            f"{safe(s.schedule)[:28]:<28} {safe(s.owner or '-')[:14]:<14} {s.emitted:>6} "
            f"{s.skipped:>6} {s.pending:>5} {s.missing:>6} {s.dead:>5}"
        )
    if not result.summary:
        out.append("(no schedule was in force in the window)")
    for note in result.notes:
        out.append(f"note: {note}")
    return "\n".join(out)


@click.command("history")
@database_options
@click.argument("names", nargs=-1)
@click.option("--since", default="24h", show_default=True,
              help="Start of the window: a duration back from now (24h, 7d) or an ISO instant.")
@click.option("--until", default=None, help="End of the window, ISO instant (default: now).")
@format_option
@click.option("--fail-on", "fail_on", type=click.Choice(["dead"]), multiple=True,
              help="Also exit 1 when a period's job is dead.")
@click.option("--retention-days", envvar="CRONKEEPER_RETENTION_PERIODS_DAYS",
              type=click.FloatRange(1, DEFAULT_RETENTION_DAYS), default=DEFAULT_RETENTION_DAYS,
              show_default=True,
              help="Cut the window this far back (the leader keeps period outcomes "
                   f"{DEFAULT_RETENTION_DAYS:g} days: a longer horizon would call the periods "
                   "it pruned missing).")
@click.pass_context
def history_command(ctx, database_url, schema, cluster, names, since, until, fmt, fail_on,
                    retention_days) -> None:
    """Audit each period of the schedules: emitted, skipped (why), pending or missing.

    Exit 1 when any period is missing (and with --fail-on dead, when a job is dead)."""
    from cronkeeper.cli.connect import open_database

    db = open_database(database_url, schema, application_name="cronkeeper-history")
    gc.disable()  # half a million short-lived tuples and no cycles: the collector only slows it
    try:
        result = collect(db.engine, names, since, until, retention_days)
    finally:
        db.engine.dispose()
    if fmt == "json":
        write_json(result, sys.stdout)
    else:
        sys.stdout.write(render_table(result) + "\n")
    sys.stdout.flush()
    if result.missing:
        click.echo(f"{result.missing} period(s) missing: no outcome was recorded for them", err=True)
        ctx.exit(1)
    if "dead" in fail_on and result.dead:
        click.echo(f"{result.dead} period(s) whose job is dead (see cronkeeper dlq list)", err=True)
        ctx.exit(1)
