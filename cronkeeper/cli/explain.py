"""cronkeeper explain KEY: one period's (or job's) whole story: the decision, the emission, each
attempt (with its run time) and the final state (§7), and the attempts' run time against the
schedule's p99 and timeout (§8)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, overload

import click

from cronkeeper.cli.common import database_options, format_option, safe
from cronkeeper.errors import CronkeeperError
from cronkeeper.runtimes import SAMPLE, json_fields, runtime_of, seconds


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


@overload
def clean(row: dict[str, Any]) -> dict[str, Any]: ...
@overload
def clean(row: dict[str, Any] | None) -> dict[str, Any] | None: ...
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
        "attempts": [{**clean(a), "duration_seconds": _duration(a)} for a in attempts],
        "final_state": job["state"] if job else (period["outcome"] if period else None),
        "runtime": runtime_story(conn, job),
    }


def _duration(attempt: dict[str, Any]) -> float | None:
    if attempt["finished_at"] is None:
        return None
    return round((attempt["finished_at"] - attempt["started_at"]).total_seconds(), 3)


def runtime_story(conn: Any, job: dict[str, Any] | None) -> dict[str, Any] | None:
    """The schedule's run-time figures, as ``status`` gives them (its timeout: the version in
    force), beside the timeout this job was held to; None for a job without a schedule."""
    from cronkeeper.db.attempts import attempts_runtimes
    from cronkeeper.db.audit import versions_current_of

    if job is None or not job["schedule"]:
        return None
    name = job["schedule"]
    timeout = float(job["timeout_seconds"])
    spec = versions_current_of(conn, name)
    if isinstance(spec, dict) and isinstance(spec.get("timeout"), int | float):
        timeout = float(spec["timeout"])
    runtime = runtime_of(name, timeout, attempts_runtimes(conn, [name], SAMPLE).get(name))
    return {"schedule": name, **json_fields(runtime),
            "job_timeout_seconds": float(job["timeout_seconds"])}


def runtime_lines(result: dict[str, Any]) -> list[str]:
    """The run-time part of the text story: each finished attempt against the job's timeout,
    then the schedule's figures."""
    rt = result.get("runtime")
    if rt is None:
        return []
    lines = []
    limit = rt["job_timeout_seconds"]
    for a in result["attempts"]:
        took = a["duration_seconds"]
        if took is not None:
            counted = limit if a["outcome"] == "timeout" else took
            lines.append(f"run time: attempt {a['attempt']} ran {seconds(took)}, "
                         f"{counted / limit:.0%} of its {seconds(limit)} timeout" if limit > 0
                         else f"run time: attempt {a['attempt']} ran {seconds(took)}")
    near = " - near its timeout (`cronkeeper status` says what to change)" if rt["near_timeout"] else ""
    lines.append(
        f"schedule {safe(rt['schedule'])}: p99 {seconds(rt['duration_p99_seconds'])}, p50 "
        f"{seconds(rt['duration_p50_seconds'])} over its last {rt['duration_attempts']} finished "
        f"attempts; timeout {seconds(rt['timeout_seconds'])}; "
        f"{rt['attempts_timed_out_24h']} timed out in the last 24 h{near}")
    return lines


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
        took = f" ({seconds(a['duration_seconds'])})" if a["duration_seconds"] is not None else ""
        click.echo(f"attempt {a['attempt']}: {a['outcome'] or 'running'} by {safe(a['worker_id'])} "
                   f"{a['started_at']} .. {a['finished_at'] or '-'}{took}{err}")
    if e and e.get("published_at"):
        outcome = {"published": "outcome not reported yet (or the target cannot tell)",
                   "succeeded": f"the target reported it succeeded at {e['finished_at']}",
                   "dead": f"the target reported it failed at {e['finished_at']}"}.get(e["state"], "")
        click.echo(f"publication: to {safe(e['published_to'])} as {safe(e['target_id'])} at "
                   f"{e['published_at']}; {outcome}")
    for line in runtime_lines(result):
        click.echo(line)
    final = result["final_state"]
    extra = f" - {safe(e['last_error'])}" if e and e.get("last_error") else ""
    click.echo(f"final state: {final}{extra}")
