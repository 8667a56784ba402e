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
from cronkeeper.planning import calendar_mark, period_of_key
from cronkeeper.runtimes import SAMPLE, json_fields, runtime_of
from cronkeeper.schedule.model import read_stored_version
from cronkeeper.timing import load_zone


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
    history = versions_all(conn, [parsed[0]]) if parsed is not None else []
    return {
        "key": key,
        "decision": clean(period),
        "calendar": calendar_story(history, period),
        "emission": clean(job),
        "attempts": [{**clean(attempt_view(a)), "duration_seconds": _duration(a)}
                     for a in attempts],
        "final_state": job["state"] if job else (period["outcome"] if period else None),
        "runtime": runtime_story(conn, job),
    }


def calendar_story(history: list[Any], period: dict[str, Any] | None) -> dict[str, Any] | None:
    """How a period stands to the calendar of the version that decided it, or None when that
    version has no calendar: its name, policy, the period's local date, whether the calendar
    lists it (the period was skipped, reason ``calendar``), and the listed dates a
    ``next_day`` fire was moved from."""
    if period is None:
        return None
    row = next((v for v in history if v[0] == period["version_id"]), None)
    if row is None or not isinstance(row[2], dict) or row[2].get("calendar") is None:
        return None
    try:
        spec, trigger = read_stored_version(row[1], row[0], row[2])
    except CronkeeperError:
        return None  # the runtime story says nothing of an unreadable version either
    if spec.calendar is None:
        return None
    at = period["scheduled_for"]
    mark = calendar_mark(spec, trigger, at)
    return {
        "name": spec.calendar.name, "on_calendar": str(spec.on_calendar),
        "timezone": spec.timezone, "local_date": at.astimezone(load_zone(spec.timezone)).date(
        ).isoformat(), "listed": mark is not None and mark.kind == "skipped",
        "moved_from": [d.isoformat() for d in mark.days] if mark and mark.kind == "moved" else [],
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
