"""cronkeeper status: instances, leader and term, the advisory lock key, each schedule's next
fire, last outcome, pause and run time against its timeout, the queue, and a diagnosis in words
when something is wrong (docs/observability.md). The document and the diagnosis are
``cronkeeper.operations.status``; this renders them.

Schedules come from the versions in force in the database (what the leader plans with), not
from local files; with ``--schedules`` the local files are read only to say at which file and
line a schedule near its timeout sets ``timeout``. The database URL is shown with its password
hidden.
"""

from __future__ import annotations

import gc
from typing import Any

import click

from cronkeeper.cli.common import database_options, format_option, safe
from cronkeeper.operations.status import dumps, gather
from cronkeeper.runtimes import seconds


def _skew(seconds: float | None) -> str:
    """Database clock minus the instance's, as the instances table shows it."""
    return "-" if seconds is None else f"{seconds:+.1f}s"


def _figures(source: dict[str, Any] | None) -> str:
    """Where the schedules' missing counts and run-time figures came from, and how old."""
    if not source or not source["summarized"]:
        return "FIGURES  computed now"
    text = (f"FIGURES  {source['summarized']} schedule(s) from the leader's summary, the oldest "
            f"{source['oldest_age_seconds']:.0f}s old")
    if source["computed_live"]:
        text += f"; {source['computed_live']} computed now"
    return text


def render(doc: dict[str, Any]) -> str:
    lines = [f"cluster {safe(doc['cluster'])}  schema {doc['schema']}  database "
             f"{safe(doc['database'] or '-')}",
             f"advisory lock key {doc['lock_key']} ({'held' if doc['lock_held'] else 'free'})"]
    lead = doc["leader"]
    if lead:
        lines.append(f"leader: {safe(lead['instance_id'])} term {lead['term']} since {lead['since']}")
    else:
        lines.append("leader: none")
    lines += ["", "INSTANCES", f"  {'ID':<28} {'KIND':<9} {'ROLE':<7} {'PID':>7} {'VERSION':<11} "
              f"{'DIGEST':<12} {'TZDATA':<7} {'SKEW':>9}"]
    for i in doc["instances"]:
        lines.append(f"  {safe(i['instance_id'])[:28]:<28} {i['kind']:<9} {i['role']:<7} "
                     f"{i['pid']:>7} {safe(i['version'])[:11]:<11} "
                     f"{safe(i['schedules_digest'])[:12]:<12} {safe(i['tzdata_version'])[:7]:<7} "
                     f"{_skew(i['clock_skew_seconds']):>9}")
    if not doc["instances"]:
        lines.append("  (no live instance)")
    for i in doc.get("stopped_instances", []):
        lines.append(f"  {safe(i['instance_id'])[:28]:<28} {i['kind']:<9} stopped at "
                     f"{i['stopped_at']} ({safe(i['version'])})")
    lines += ["", "SCHEDULES", f"  {'NAME':<24} {'SOURCE':<7} {'NEXT FIRE (UTC)':<20} {'LAST OUTCOME':<26} "
              f"{'PAUSED':<6} {'P50':>7} {'P99':>7} {'TIMEOUT':>7} {'TO/24H':>6}"]
    for s in doc["schedules"]:
        nxt = (s["next_fire"] or "never")[:19].replace("T", " ") + ("!" if s["overdue"] else "")
        last = s["last_outcome"]
        text = "-"
        if last:
            text = last["outcome"] + (f" ({last['reason']})" if last["reason"] else "")
            text += f" {last['job_state']}" if last["job_state"] else ""
        mark = "!" if s["near_timeout"] else ""
        lines.append(f"  {safe(s['name'])[:24]:<24} {s.get('source', 'file'):<7} {nxt:<20} {text[:26]:<26} "
                     f"{'yes' if s['paused'] else 'no':<6} {seconds(s['duration_p50_seconds']):>7} "
                     f"{seconds(s['duration_p99_seconds']) + mark:>7} "
                     f"{seconds(s['timeout_seconds']):>7} {s['attempts_timed_out_24h']:>6}")
    if not doc["schedules"]:
        lines.append("  (no schedule in force: a leader adopts the schedule files)")
    lines.append(_figures(doc.get("figures")))
    depth = doc["queue"]["depth"]
    lines += ["", "QUEUE  " + "  ".join(f"{k} {v}" for k, v in depth.items())]
    for r in doc.get("relay_routes", []):
        match = " and ".join(f"{what} {','.join(globs)}" for what, globs in
                             (("tasks", r["tasks"]), ("schedules", r["schedules"])) if globs)
        lines.append(f"RELAY  {safe(r['relay'])} route {r['position'] + 1}: {safe(match)} -> "
                     f"{safe(r['target'])}")
    lines.append("")
    if doc["diagnosis"]:
        lines.append("DIAGNOSIS")
        lines += [f"  - {safe(d)}" for d in doc["diagnosis"]]
    else:
        lines.append("DIAGNOSIS  nothing wrong found")
    return "\n".join(lines)


@click.command("status")
@database_options
@format_option
@click.option("--leader-timeout", envvar="CRONKEEPER_LEADER_TIMEOUT", type=float, default=10.0,
              show_default=True, help="A leader whose heartbeat is older than this is not shown.")
@click.option("--schedules", "schedules_path", envvar="CRONKEEPER_SCHEDULES", default=None,
              type=click.Path(exists=True, path_type=str),
              help="Schedule files (env CRONKEEPER_SCHEDULES), read only to name the file and "
                   "line of the `timeout` of a schedule near it.")
def status_command(database_url, schema, cluster, fmt, leader_timeout, schedules_path) -> None:
    """Show instances, the leader, schedules (run time against timeout too) and the queue,
    and say what is wrong."""
    # A one-shot command whose objects all live until it exits: the cyclic collector's passes
    # over them buy nothing and cost a fifth of building the document at 10,000 schedules
    # (docs/performance.md). Restored after, for callers in-process (tests).
    collecting = gc.isenabled()
    gc.disable()
    try:
        _status(database_url, schema, cluster, fmt, leader_timeout, schedules_path)
    finally:
        if collecting:
            gc.enable()


def _status(database_url, schema, cluster, fmt, leader_timeout, schedules_path) -> None:
    from cronkeeper.cli.connect import open_direct
    from cronkeeper.db.engine import redact

    # psycopg alone, when it can: status never needed SQLAlchemy, whose import was a fifth of
    # its CPU at 10,000 schedules (docs/performance.md).
    db = open_direct(database_url, schema, application_name="cronkeeper-status")
    try:
        doc = gather(db.engine, schema, cluster, leader_timeout=leader_timeout,
                     schedules_path=schedules_path)
    finally:
        db.engine.dispose()
    doc["database"] = redact(db.url)
    if fmt == "json":
        click.echo(dumps(doc))
    else:
        click.echo(render(doc))
