"""``cronkeeper.enqueue``: an application's own job, written into the outbox inside the
application's transaction (the outbox pattern): the job exists if and only if the caller commits.

Accepts a SQLAlchemy ``Connection`` or a psycopg 3 ``Connection``. The statement is schema-
qualified, so the connection needs no particular search_path. A duplicate ``key`` inserts nothing
and returns ``None`` (the existing job is left exactly as it is); a new job returns its id.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa

from cronkeeper.db.engine import check_schema_name, translate_errors
from cronkeeper.errors import UsageError

_INSERT = """
INSERT INTO {schema}.outbox (idempotency_key, task, payload, run_after, max_attempts,
                             timeout_seconds, backoff)
VALUES (%(key)s, %(task)s, %(payload)s::jsonb,
        coalesce(%(at)s::timestamptz, now()) + make_interval(secs => %(delay)s),
        %(max_attempts)s, %(timeout)s, %(backoff)s::jsonb)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id
"""


def enqueue(
    connection: sa.Connection | psycopg.Connection,
    task: str,
    payload: dict[str, Any] | None = None,
    *,
    key: str,
    run_after: datetime | timedelta | float | None = None,
    schema: str = "cronkeeper",
    max_attempts: int = 5,
    timeout: float = 600.0,
    backoff: dict[str, float] | None = None,
) -> int | None:
    """Insert a job in the caller's transaction; return its id, or None when ``key`` exists.

    ``run_after``: an aware datetime, a delay (timedelta or seconds), or None for "now" (the
    transaction's time). Nothing is committed here: the caller's commit publishes the job.
    """
    if not task or not isinstance(task, str):
        raise UsageError("enqueue: task must be a non-empty string")
    if not key or not isinstance(key, str):
        raise UsageError("enqueue: key must be a non-empty string (the job's idempotency key)")
    if max_attempts < 1:
        raise UsageError("enqueue: max_attempts must be at least 1")
    at, delay = _when(run_after)
    params = {
        "key": key, "task": task, "at": at, "delay": delay,
        "payload": json.dumps(payload if payload is not None else {}, allow_nan=False),
        "max_attempts": max_attempts, "timeout": float(timeout),
        "backoff": json.dumps(backoff or {"base": 30, "factor": 2, "max": 3600}),
    }
    sql = _INSERT.format(schema=_quoted(schema))
    with translate_errors("enqueueing a job"):
        if isinstance(connection, sa.Connection):
            # Through SQLAlchemy, so its transaction begins and the caller's commit covers it.
            row = connection.exec_driver_sql(sql, params).fetchone()
        elif isinstance(connection, psycopg.Connection):
            row = connection.execute(sql, params).fetchone()
        else:
            raise UsageError(
                "enqueue needs a SQLAlchemy Connection or a psycopg Connection, "
                f"not {type(connection).__name__}"
            )
    return None if row is None else int(row[0])


def _when(run_after: datetime | timedelta | float | None) -> tuple[datetime | None, float]:
    if run_after is None:
        return None, 0.0
    if isinstance(run_after, datetime):
        if run_after.tzinfo is None:
            raise UsageError("enqueue: run_after must be timezone-aware")
        return run_after, 0.0
    if isinstance(run_after, timedelta):
        return None, run_after.total_seconds()
    if isinstance(run_after, int | float):
        return None, float(run_after)
    raise UsageError("enqueue: run_after must be a datetime, a timedelta, seconds or None")


def _quoted(schema: str) -> str:
    return '"' + check_schema_name(schema) + '"'
