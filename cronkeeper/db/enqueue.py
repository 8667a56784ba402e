"""``cronkeeper.enqueue`` and ``cronkeeper.enqueue_many``: an application's own jobs, written into
the outbox inside the application's transaction (the outbox pattern): the jobs exist if and only
if the caller commits.

Accepts a SQLAlchemy ``Connection`` or a psycopg 3 ``Connection``. The statements are schema-
qualified, so the connection needs no particular search_path. A duplicate ``key`` inserts nothing
and comes back as ``None`` (the existing job is left exactly as it is); a new job returns its id.
Each statement wakes idle workers (``pg_notify``, delivered at commit: see ``db/wake.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa

from cronkeeper.backoff import DEFAULT_BASE, DEFAULT_FACTOR, DEFAULT_MAX
from cronkeeper.db.engine import check_schema_name, translate_errors
from cronkeeper.db.wake import wake, wake_channel
from cronkeeper.errors import UsageError

# backoff's defaults, written as whole numbers where they are (the stored JSON stays as it was)
DEFAULT_BACKOFF = {key: int(value) if value.is_integer() else value for key, value in
                   (("base", DEFAULT_BASE), ("factor", DEFAULT_FACTOR), ("max", DEFAULT_MAX))}
_DEFAULT_BACKOFF_JSON = json.dumps(DEFAULT_BACKOFF)

_INSERT = """
WITH ins AS (
    INSERT INTO {schema}.outbox (idempotency_key, task, payload, run_after, max_attempts,
                                 timeout_seconds, backoff)
    VALUES (%(key)s, %(task)s, %(payload)s::jsonb,
            coalesce(%(at)s::timestamptz, now()) + make_interval(secs => %(delay)s),
            %(max_attempts)s, %(timeout)s, %(backoff)s::jsonb)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
), woke AS ({wake})
SELECT id FROM ins, woke
"""

# One statement for the whole list. The jobs travel as one JSON document (built by the C JSON
# encoder, parsed by PostgreSQL's, payloads already jsonb): about twice as fast as eight arrays
# through the driver's array adapters. Rows are inserted in input order (ids ascend with it);
# duplicates of existing keys are skipped by the unique index. Absent fields take enqueue's
# defaults: keep them in step with its signature.
_INSERT_MANY = """
WITH ins AS (
    INSERT INTO {schema}.outbox (idempotency_key, task, payload, run_after, max_attempts,
                                 timeout_seconds, backoff)
    SELECT j.k, j.t, coalesce(j.p, '{{}}'),
           coalesce(j.a, now()) + make_interval(secs => coalesce(j.d, 0)),
           coalesce(j.m, 5), coalesce(j.o, 600), coalesce(j.b, %(backoff)s::jsonb)
    FROM ROWS FROM (jsonb_to_recordset(%(jobs)s::jsonb)
                    AS (k text, t text, p jsonb, a timestamptz, d float8, m int4, o float8,
                        b jsonb))
         WITH ORDINALITY AS j(k, t, p, a, d, m, o, b, ord)
    ORDER BY j.ord
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING idempotency_key, id
), woke AS ({wake})
SELECT array_agg(ins.idempotency_key), array_agg(ins.id) FROM ins, woke
"""

_FIELDS = ("task", "payload", "key", "run_after", "max_attempts", "timeout", "backoff")
_FIELD_SET = frozenset(_FIELDS)


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
    sql, params = enqueue_statement(task, payload, key=key, run_after=run_after, schema=schema,
                                    max_attempts=max_attempts, timeout=timeout, backoff=backoff)
    rows = _execute(connection, sql, params, "enqueue")
    return int(rows[0][0]) if rows else None


def enqueue_statement(
    task: str,
    payload: dict[str, Any] | None,
    *,
    key: str,
    run_after: datetime | timedelta | float | None,
    schema: str,
    max_attempts: int,
    timeout: float,
    backoff: dict[str, float] | None,
) -> tuple[str, dict[str, Any]]:
    """The checked INSERT (with its wake-up) and its parameters: shared by ``enqueue`` and
    ``enqueue_async``."""
    _check("enqueue", task, payload, key, max_attempts, timeout)
    at, delay = _when("enqueue", run_after)
    params = {
        "key": key, "task": task, "at": at, "delay": delay,
        "payload": _json("enqueue", payload if payload is not None else {}),
        "max_attempts": max_attempts, "timeout": float(timeout),
        "backoff": _json("enqueue", backoff) if backoff else _DEFAULT_BACKOFF_JSON,
        "channel": wake_channel(schema),
    }
    return _INSERT.format(schema=_quoted(schema), wake=wake("ins", "%(channel)s")), params


async def enqueue_async(
    conn: psycopg.AsyncConnection, task: str, payload: dict[str, Any] | None = None, *,
    key: str, schema: str = "cronkeeper", **options: Any,
) -> int | None:
    """``cronkeeper.enqueue`` on an async connection (same checks, same statement)."""
    if not isinstance(conn, psycopg.AsyncConnection):
        raise UsageError(f"enqueue_async needs a psycopg AsyncConnection, not {type(conn).__name__}")
    sql, params = enqueue_statement(
        task, payload, key=key, schema=schema, run_after=options.pop("run_after", None),
        max_attempts=options.pop("max_attempts", 5), timeout=options.pop("timeout", 600.0),
        backoff=options.pop("backoff", None), **options,
    )
    with translate_errors("enqueueing a job"):
        row = await (await conn.execute(sql, params)).fetchone()
    return None if row is None else int(row[0])


def enqueue_many(
    connection: sa.Connection | psycopg.Connection,
    jobs: Iterable[Mapping[str, Any]],
    *,
    schema: str = "cronkeeper",
) -> list[int | None]:
    """Insert many jobs in one statement, in the caller's transaction.

    ``jobs``: mappings with ``enqueue``'s arguments as keys (``task`` and ``key`` required;
    ``payload``, ``run_after``, ``max_attempts``, ``timeout``, ``backoff`` optional), checked
    exactly as ``enqueue`` checks them; one bad job refuses the whole call, before anything is
    written. Returns the ids in input order: ``None`` where the key already existed (a job of
    an earlier transaction, or an earlier item of this same list), never a second job.
    """
    if isinstance(jobs, Mapping | str | bytes) or not isinstance(jobs, Iterable):
        raise UsageError("enqueue_many: jobs must be an iterable of mappings (one per job), "
                         f"not {type(jobs).__name__}")
    rows: list[dict[str, Any]] = []
    keys: list[str] = []
    first: dict[str, int] = {}  # key -> index of its first occurrence: the one written
    for n, item in enumerate(jobs):
        if not isinstance(item, Mapping):
            raise UsageError(f"enqueue_many: jobs[{n}]: expected a mapping with keys "
                             f"{', '.join(_FIELDS)}, not {type(item).__name__}")
        if not item.keys() <= _FIELD_SET:
            unknown = sorted(str(k) for k in item if k not in _FIELD_SET)
            raise UsageError(f"enqueue_many: jobs[{n}]: unknown key(s) {', '.join(unknown)}; "
                             f"expected some of {', '.join(_FIELDS)}")
        if "task" not in item or "key" not in item:
            raise UsageError(f"enqueue_many: jobs[{n}]: 'task' and 'key' are required")
        key, task, payload = item["key"], item["task"], item.get("payload")
        max_attempts, timeout = item.get("max_attempts", 5), item.get("timeout", 600.0)
        _check(f"enqueue_many: jobs[{n}]", task, payload, key, max_attempts, timeout)
        keys.append(key)
        if key in first:
            continue
        first[key] = n
        row: dict[str, Any] = {"k": key, "t": task}
        if payload:
            row["p"] = payload if isinstance(payload, dict) else dict(payload)
        if item.get("run_after") is not None:
            at, delay = _when(f"enqueue_many: jobs[{n}]", item["run_after"])
            row["a" if at is not None else "d"] = at.isoformat() if at is not None else delay
        if max_attempts != 5:
            row["m"] = max_attempts
        if timeout != 600.0:
            row["o"] = float(timeout)
        if item.get("backoff"):
            row["b"] = item["backoff"]
        rows.append(row)
    check_schema_name(schema)
    if not rows:
        return []
    try:
        document = json.dumps(rows, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        for row in rows:  # find the job that is not strict JSON, and say which
            _json(f"enqueue_many: jobs[{first[row['k']]}]", row)
        raise
    params = {"jobs": document, "backoff": _DEFAULT_BACKOFF_JSON, "channel": wake_channel(schema)}
    sql = _INSERT_MANY.format(schema=_quoted(schema), wake=wake("ins", "%(channel)s"))
    (written, ids), = _execute(connection, sql, params, "enqueue_many")
    by_key = dict(zip(written or (), ids or (), strict=True))
    return [by_key.get(key) if first[key] == n else None for n, key in enumerate(keys)]


def _execute(connection: Any, sql: str, params: dict[str, Any], name: str) -> list[tuple]:
    with translate_errors(f"{name}: writing to the outbox"):
        if isinstance(connection, sa.Connection):
            # Through SQLAlchemy, so its transaction begins and the caller's commit covers it.
            return list(connection.exec_driver_sql(sql, params).fetchall())
        if isinstance(connection, psycopg.Connection):
            return connection.execute(sql, params).fetchall()
    raise UsageError(f"{name} needs a SQLAlchemy Connection or a psycopg Connection, "
                     f"not {type(connection).__name__}")


def _check(where: str, task: Any, payload: Any, key: Any, max_attempts: Any, timeout: Any) -> None:
    """One job's arguments, checked: a UsageError says which and why."""
    if not task or not isinstance(task, str):
        raise UsageError(f"{where}: task must be a non-empty string")
    if not key or not isinstance(key, str):
        raise UsageError(f"{where}: key must be a non-empty string (the job's idempotency key)")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise UsageError(f"{where}: max_attempts must be an integer of at least 1")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise UsageError(f"{where}: timeout must be a positive number of seconds")
    if payload is not None and not isinstance(payload, Mapping):
        raise UsageError(f"{where}: payload must be a JSON object (a mapping), "
                         f"not {type(payload).__name__}")


def _json(where: str, value: Any) -> str:
    try:
        return json.dumps(value if not isinstance(value, Mapping) or isinstance(value, dict)
                          else dict(value), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: payload and backoff must be strict JSON: {exc}") from None


def _when(where: str, run_after: Any) -> tuple[datetime | None, float]:
    if run_after is None:
        return None, 0.0
    if isinstance(run_after, datetime):
        if run_after.tzinfo is None:
            raise UsageError(f"{where}: run_after must be timezone-aware")
        return run_after, 0.0
    if isinstance(run_after, timedelta):
        return None, run_after.total_seconds()
    if isinstance(run_after, int | float) and not isinstance(run_after, bool):
        return None, float(run_after)
    raise UsageError(f"{where}: run_after must be a datetime, a timedelta, seconds or None")


def _quoted(schema: str) -> str:
    return '"' + check_schema_name(schema) + '"'
