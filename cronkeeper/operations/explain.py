"""One period's (or job's) whole story: the decision, the emission, each attempt with its run
time and what it printed (its size and last 10 lines, escaped), the final state, and the schedule's run time against its timeout (``cronkeeper explain``
and the web's explain pages tell the same one)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, overload

from cronkeeper.db.attempts import attempts_for_job, attempts_runtimes
from cronkeeper.db.outbox import outbox_get_by_key
from cronkeeper.db.periods import periods_get
from cronkeeper.db.schedule_versions import versions_all
from cronkeeper.errors import CronkeeperError
from cronkeeper.operations.output import attempt_view
from cronkeeper.planning import period_of_key
from cronkeeper.runtimes import SAMPLE, json_fields, runtime_of


def _iso(value: Any) -> Any:
    return value.isoformat().replace("+00:00", "Z") if isinstance(value, datetime) else value


@overload
def clean(row: dict[str, Any]) -> dict[str, Any]: ...
@overload
def clean(row: dict[str, Any] | None) -> dict[str, Any] | None: ...
def clean(row: dict[str, Any] | None) -> dict[str, Any] | None:
    return {k: _iso(v) for k, v in row.items()} if row else None


def story(conn: Any, key: str) -> dict[str, Any]:
    job = outbox_get_by_key(conn, key)
    period = None
    parsed = period_of_key(key)
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
        "attempts": [{**clean(attempt_view(a)), "duration_seconds": _duration(a)}
                     for a in attempts],
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
    if job is None or not job["schedule"]:
        return None
    name = job["schedule"]
    timeout = float(job["timeout_seconds"])
    history = versions_all(conn, [name])
    spec = history[-1][2] if history else None  # the newest version's (None: removed)
    if isinstance(spec, dict) and isinstance(spec.get("timeout"), int | float):
        timeout = float(spec["timeout"])
    runtime = runtime_of(name, timeout, attempts_runtimes(conn, [name], SAMPLE).get(name))
    return {"schedule": name, **json_fields(runtime),
            "job_timeout_seconds": float(job["timeout_seconds"])}


def dumps(result: dict[str, Any]) -> str:
    """``explain --format json``: the web's ``/api/explain/KEY`` is the same text."""
    return json.dumps(result, indent=2, default=str)
