"""The database sessions handlers run their job's transaction on, beyond the worker's engine:

- an ``async def`` handler's transaction is a psycopg ``AsyncConnection`` (search_path = the
  schema, like the engine's connections); the effect claim, ``enqueue`` and the fenced
  completion run on it with the very statements the sync path uses (one SQL text each);
- a process-isolated handler's session is known to the worker by its backend pid, so that a
  handler killed at its timeout has its transaction ended at once (``pg_terminate_backend``),
  not when the server next notices the closed socket (a backend busy in a query does not).
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
import sqlalchemy as sa

from cronkeeper.db.effects import _CLAIM_EFFECT
from cronkeeper.db.engine import check_schema_name, conninfo, driver, translate_errors
from cronkeeper.db.enqueue import enqueue_statement
from cronkeeper.db.outbox import _COMPLETE
from cronkeeper.errors import UsageError

AsyncConnection = psycopg.AsyncConnection


async def async_job_connection(
    engine: sa.Engine, schema: str, application_name: str = "cronkeeper-worker"
) -> psycopg.AsyncConnection:
    """A new async connection to the engine's database, its search_path on ``schema``."""
    info = conninfo(engine.url, options=f"-c search_path={check_schema_name(schema)}")
    with translate_errors("opening the job's async connection"):
        return await psycopg.AsyncConnection.connect(
            info, application_name=application_name, connect_timeout=10
        )


async def effects_claim_async(
    conn: psycopg.AsyncConnection, schema: str, name: str, job_key: str | None
) -> bool:
    """``effects_claim`` on an async connection: True the first time only."""
    sql = _CLAIM_EFFECT.format(schema=check_schema_name(schema))
    with translate_errors("claiming an effect"):
        cur = await conn.execute(sql, {"key": name, "job": job_key})
        return await cur.fetchone() is not None


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


async def outbox_complete_async(
    conn: psycopg.AsyncConnection, *, worker_id: str, ids: list[int], attempts: list[int]
) -> list[int]:
    """``outbox_complete`` (fenced) on an async connection."""
    params = {"ids": ids, "attempts": attempts, "ages": None, "worker": worker_id}
    with translate_errors("completing the job"):
        cur = await conn.execute(_COMPLETE, params, binary=True)
        return [r[0] for r in await cur.fetchall()]


def async_connection_reusable(conn: psycopg.AsyncConnection) -> bool:
    """Open, not broken, and outside any transaction: fit for the next job's transaction."""
    return (not conn.closed and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)


def async_connection_drop(conn: psycopg.AsyncConnection) -> None:
    """Close an async connection's socket without its event loop (one that will not run again):
    the server rolls its transaction back."""
    with contextlib.suppress(Exception):
        conn.pgconn.finish()


def backend_pid(conn: sa.Connection | psycopg.Connection | psycopg.AsyncConnection) -> int:
    """The server process of a connection's session (no round trip)."""
    if isinstance(conn, psycopg.AsyncConnection):
        return int(conn.info.backend_pid)
    return int(driver(conn).info.backend_pid)


HANDLER_APPLICATION = "cronkeeper-handler"  # application_name of handler processes' sessions

_TERMINATE = """
SELECT pg_terminate_backend(pid, %(ms)s) FROM pg_stat_activity
WHERE pid = %(pid)s AND application_name = %(app)s
"""


def handler_session_terminate(conn: sa.Connection, pid: int, wait_ms: int = 5000) -> bool:
    """End a handler process's session and wait (up to ``wait_ms``) until it is gone, its
    transaction rolled back; False when it had already ended (or outlived the wait). Only a
    session of a handler process: a pid the server has since given to another client's
    session is left alone."""
    row = driver(conn).execute(_TERMINATE, {"pid": pid, "ms": wait_ms,
                                            "app": HANDLER_APPLICATION}).fetchone()
    return bool(row and row[0])
