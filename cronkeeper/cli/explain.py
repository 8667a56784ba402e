"""cronkeeper explain KEY: one period's (or job's) whole story: the decision, the emission, each
attempt and the final state (§7)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from cronkeeper.cli.common import database_options, format_option, safe
from cronkeeper.errors import CronkeeperError


def _iso(value: Any) -> Any:
    return value.isoformat().replace("+00:00", "Z") if isinstance(value, datetime) else value


def _period_of(key: str) -> tuple[str, datetime] | None:
    name, sep, at = key.rpartition("@")
    if not sep:
        return None
    try:
        return name, datetime.fromisoformat(at.replace("Z", "+00:00"))
    except ValueError:
        return None


def clean(row: dict[str, Any] | None) -> dict[str, Any] | None:
    return {k: _iso(v) for k, v in row.items()} if row else None


def story(conn: Any, key: str) -> dict[str, Any]:
    from cronkeeper.db.attempts import attempts_for_job, outbox_get_by_key, periods_get

    job = outbox_get_by_key(conn, key)
    period = None
    parsed = _period_of(key)
    if job is not None and job["schedule"] and job["scheduled_for"]:
        parsed = (job["schedule"], job["scheduled_for"])
    if parsed is not None:
        period = periods_get(conn, *parsed)
    attempts = attempts_for_job(conn, job["id"]) if job else []
    if job is None and period is None:
        raise CronkeeperError(f"nothing recorded for {key!r}: no period and no job with that key "
                              "(pruned after retention, or never decided)")
    return {
        "key": key,
        "decision": clean(period),
        "emission": clean(job),
        "attempts": [clean(a) for a in attempts],
        "final_state": job["state"] if job else (period["outcome"] if period else None),
    }


def dumps(result: dict[str, Any]) -> str:
    """``explain --format json``: the web's ``/api/explain/KEY`` is the same text."""
    return json.dumps(result, indent=2, default=str)


@click.command("explain")
@database_options
@click.argument("key")
@format_option
def explain_command(database_url, schema, cluster, key, fmt) -> None:
    """Print what happened to one period or job, by its idempotency key."""
    from cronkeeper.cli.connect import open_database
    from cronkeeper.db.engine import translate_errors

    db = open_database(database_url, schema)
    with translate_errors("reading the period's story"), db.engine.connect() as conn:
        result = story(conn, key)
    if fmt == "json":
        click.echo(dumps(result))
        return
    click.echo(f"key: {safe(key)}")
    d = result["decision"]
    if d:
        reason = f" ({d['reason']})" if d["reason"] else ""
        click.echo(f"decision: {d['outcome']}{reason} at {d['decided_at']} by term {d['term']} "
                   f"(schedule version {d['version_id']}, digest {str(d['digest'])[:12]})")
    else:
        click.echo("decision: none recorded (an enqueued job, or pruned)")
    e = result["emission"]
    if e:
        click.echo(f"emission: job {e['id']} task {safe(e['task'])} created {e['created_at']} "
                   f"run_after {e['run_after']} max_attempts {e['max_attempts']}")
        click.echo(f"payload: {safe(json.dumps(e['payload']))}")
    else:
        click.echo("emission: no job in the outbox")
    for a in result["attempts"]:
        err = f": {safe(a['error'])}" if a["error"] else ""
        click.echo(f"attempt {a['attempt']}: {a['outcome'] or 'running'} by {safe(a['worker_id'])} "
                   f"{a['started_at']} .. {a['finished_at'] or '-'}{err}")
    if e and e.get("published_at"):
        outcome = {"published": "outcome not reported yet (or the target cannot tell)",
                   "succeeded": f"the target reported it succeeded at {e['finished_at']}",
                   "dead": f"the target reported it failed at {e['finished_at']}"}.get(e["state"], "")
        click.echo(f"publication: to {safe(e['published_to'])} as {safe(e['target_id'])} at "
                   f"{e['published_at']}; {outcome}")
    final = result["final_state"]
    extra = f" - {safe(e['last_error'])}" if e and e.get("last_error") else ""
    click.echo(f"final state: {final}{extra}")
