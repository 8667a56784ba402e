"""cronkeeper explain KEY: one period's (or job's) whole story: the decision, the emission, each
attempt (with its run time, and its output's size and last 10 lines) and the final state, and the attempts' run time against the
schedule's p99 and timeout (docs/worker.md, docs/observability.md). The story itself is
``cronkeeper.operations.explain``; this renders it."""

from __future__ import annotations

import json
from typing import Any

import click

from cronkeeper.cli.common import database_options, format_option, safe
from cronkeeper.operations.explain import dumps, story
from cronkeeper.runtimes import seconds


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


def output_lines(key: str, attempt: dict[str, Any]) -> list[str]:
    """What an attempt printed: its size and last lines (escaped by the story already)."""
    size = attempt.get("output_bytes")
    if size is None:
        return ["  output: none kept"] if attempt["outcome"] else []
    if size == 0:
        return ["  output: nothing printed"]
    lines = attempt["output_last_lines"]
    more = f"; last {len(lines)} line{'s' if len(lines) != 1 else ''}:" if lines else ""
    head = (f"  output: {size:,} bytes (all: cronkeeper output {safe(key)} --attempt "
            f"{attempt['attempt']}){more}")
    return [head] + [f"  | {line}" for line in lines]


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
    c = result.get("calendar")
    if c:
        if c["listed"]:
            said = f"lists {c['local_date']}, the period's local date in {c['timezone']}"
        elif c["moved_from"]:
            said = (f"lists {', '.join(c['moved_from'])}: this fire was moved from there "
                    f"to {c['local_date']} (on_calendar = next_day)")
        else:
            said = f"does not list {c['local_date']} (on_calendar = {c['on_calendar']})"
        click.echo(f"calendar: '{safe(c['name'])}' {said}")
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
        for line in output_lines(key, a):
            click.echo(line)
    if e and e.get("published_at"):
        outcome = {"published": "outcome not reported yet (or the target cannot tell)",
                   "succeeded": f"the target reported it succeeded at {e['finished_at']}",
                   "dead": f"the target reported it failed at {e['finished_at']}"}.get(e["state"], "")
        click.echo(f"publication: to {safe(e['published_to'])} as {safe(e['target_id'])} at "
                   f"{e['published_at']}; {outcome}")
    for line in runtime_lines(result):
        click.echo(line)
    final = result["final_state"]
    # The error only: the output's tail that last_error carries is shown with its attempt above.
    extra = f" - {safe(e['last_error'].partition(chr(10))[0])}" if e and e.get("last_error") else ""
    click.echo(f"final state: {final}{extra}")
