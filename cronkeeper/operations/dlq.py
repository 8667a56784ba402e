"""Dead letters: which a filter selects, their JSON documents (``dlq list|show --format json``
and the web's ``/api/dlq`` are the same), and replay or discard of exactly the ones confirmed."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from cronkeeper.db import attempts as db_attempts
from cronkeeper.db import outbox as db_outbox
from cronkeeper.db.engine import Engine, translate_errors
from cronkeeper.errors import UsageError
from cronkeeper.operations.output import attempt_view
from cronkeeper.timing.durations import parse_duration


def _age(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return parse_duration(text)
    except Exception as exc:  # noqa: BLE001 - a usage error, with the parser's message
        raise UsageError(f"invalid age {text!r}: {exc}") from None


def select_dead(engine: Engine, schedule: str | None, task: str | None, older_than: str | None,
                newer_than: str | None, ids: list[int] | None = None) -> list[dict]:
    """The dead letters a filter selects (ages as durations such as ``2h``), oldest first:
    what ``dlq list``, ``replay``, ``discard`` and the web's dead-letter pages act on."""
    older, newer = _age(older_than), _age(newer_than)
    with translate_errors("reading dead letters"), engine.connect() as conn:
        now = conn.exec_driver_sql("SELECT now()").scalar_one()
        return db_outbox.outbox_dead_list(
            conn, schedule=schedule, task=task, dead_before=_ago(now, older, older_than),
            dead_after=_ago(now, newer, newer_than), ids=ids, limit=100_000,
        )


def _ago(now: datetime, seconds: float | None, text: str | None) -> datetime | None:
    if seconds is None:
        return None
    try:
        return now - timedelta(seconds=seconds)
    except OverflowError:  # timedelta or datetime out of range
        raise UsageError(f"invalid age {text!r}: it reaches back before year 1") from None


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def list_document(rows: list[dict]) -> list[dict[str, Any]]:
    """``dlq list --format json``: the web's ``/api/dlq`` is the same document."""
    return [_item(r) for r in rows]


def show_document(engine: Engine, row: dict) -> dict[str, Any]:
    """``dlq show --format json``: one dead letter with every attempt (each with its output's
    size and last lines; ``last_error`` ends with the tail of the last attempt's output)."""
    with translate_errors("reading the dead letter's attempts"), engine.connect() as conn:
        attempts = db_attempts.attempts_for_job(conn, row["id"])
    return {**_item(row), "payload": row["payload"], "owner": row["owner"],
            "max_attempts": row["max_attempts"], "scheduled_for": iso(row["scheduled_for"]),
            "created_at": iso(row["created_at"]),
            "attempt_log": [{**attempt_view(a), "started_at": iso(a["started_at"]),
                             "finished_at": iso(a["finished_at"])} for a in attempts]}


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2)


def tasks_touched(rows: list[dict]) -> dict[str, int]:
    """How many of the selected jobs each task has (what a replay or discard states)."""
    tasks: dict[str, int] = {}
    for r in rows:
        tasks[r["task"]] = tasks.get(r["task"], 0) + 1
    return dict(sorted(tasks.items()))


def apply(engine: Engine, verb: str, ids: list[int]) -> list[int]:
    """Replay or discard exactly these dead letters (those still dead); returns the ids done."""
    with translate_errors(f"{verb} of dead letters"), engine.begin() as conn:
        if verb == "replay":
            db_attempts.attempts_archive(conn, ids)
            return db_outbox.outbox_dead_replay(conn, ids)
        return db_outbox.outbox_dead_discard(conn, ids)


def _item(row: dict) -> dict[str, Any]:
    return {"id": row["id"], "idempotency_key": row["idempotency_key"], "schedule": row["schedule"],
            "task": row["task"], "attempts": row["attempts"], "last_error": row["last_error"],
            "dead_at": iso(row["dead_at"])}
