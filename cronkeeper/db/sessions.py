"""Database sessions: the database's clock, per-transaction settings, the server process
behind a connection, and the async sessions handlers run their job's transaction on.

- the reads behind ``status``, ``history``, the web and the metrics set their transaction up
  here (``session_utc``, ``session_jit_off``, ``session_snapshot``);
- the leader's lock session (``db/leadership.py``) is checked and bounded here
  (``session_is_pinned``, ``session_idle_timeout_set``) and ended from another session
  (``backend_terminate``) when it stalls;
- an ``async def`` handler's transaction is a psycopg ``AsyncConnection`` (search_path = the
  schema, like the engine's connections); the effect claim, ``enqueue`` and the fenced
  completion run on it with the very statements the sync path uses (``effects_claim_async``,
  ``enqueue_async``, ``outbox_complete_async``, beside their sync twins);
- a process-isolated handler's session is known to the worker by its backend pid, so that a
  handler killed at its timeout has its transaction ended at once (``pg_terminate_backend``),
  not when the server next notices the closed socket (a backend busy in a query does not).
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import TYPE_CHECKING

import psycopg

from cronkeeper.db.engine import check_schema_name, conninfo, driver, one_row, translate_errors

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa

AsyncConnection = psycopg.AsyncConnection
HANDLER_APPLICATION = "cronkeeper-handler"  # application_name of handler processes' sessions


def db_now(conn: sa.Connection | psycopg.Connection) -> datetime:
    """The database's clock (``clock_timestamp()``, not the transaction's start): the daemon's
    "now" is the database's."""
    return one_row(driver(conn).execute("SELECT clock_timestamp()"))[0]


def session_utc(conn: sa.Connection | psycopg.Connection) -> datetime:
    """Timestamps in UTC for the rest of this transaction; returns the database's now."""
    driver(conn).execute("SELECT set_config('TimeZone', 'UTC', true)")
    return db_now(conn)


def session_jit_off(conn: sa.Connection | psycopg.Connection) -> None:
    """No JIT compilation for the rest of this transaction: the reads behind ``status`` are
    many short statements, each of which JIT would only slow down."""
    driver(conn).execute("SET LOCAL jit = off")


def session_limits(conn: sa.Connection | psycopg.Connection, *, statement_seconds: float,
                   lock_seconds: float) -> None:
    """For the rest of this transaction, each statement is cancelled after ``statement_seconds``
    and a wait for a lock after ``lock_seconds`` (``SET LOCAL``: the pooled connection goes
    back without them). A reader that must answer in time (a metrics scrape) then gets an error
    instead of holding its connection for as long as the database is slow or a lock is held."""
    driver(conn).execute(
        "SELECT set_config('statement_timeout', %(statement)s, true), "
        "set_config('lock_timeout', %(lock)s, true)",
        {"statement": f"{int(statement_seconds * 1000)}", "lock": f"{int(lock_seconds * 1000)}"})


def session_snapshot(conn: sa.Connection | psycopg.Connection) -> None:
    """The rest of this transaction reads one snapshot (REPEATABLE READ, read only): a page
    that reads the same periods twice (a state filter, then the shown strips) sees them
    once. The first statement of the transaction. JIT compilation is off for it: the page's
    statements are index range scans of a tenth of a second, but the planner, which cannot see
    how many schedules an ``unnest`` of arrays holds, costs them past ``jit_above_cost`` and
    spent 0.2-0.3 s compiling each (EXPLAIN ANALYZE, docs/web.md)."""
    driver(conn).execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    session_jit_off(conn)


def session_idle_timeout_set(conn: psycopg.Connection, seconds: float) -> None:
    """The server ends this session (and frees its lock) after ``seconds`` idle, between
    transactions or inside one: a frozen leader stops sending queries but its kernel still
    answers keepalives. The healthy leader is never idle that long (it heartbeats every second)."""
    ms = f"{int(seconds * 1000)}"
    conn.execute(
        """
        SELECT set_config('idle_session_timeout', %(ms)s, false),
               set_config('idle_in_transaction_session_timeout', %(ms)s, false)
        """,
        {"ms": ms},
    )


def session_is_pinned(conn: psycopg.Connection, probe: psycopg.Connection) -> bool:
    """True when this connection keeps one backend of its own across transactions.

    Behind a transaction-pooling proxy (PgBouncer, Supavisor) it does not, and a session
    advisory lock is then orphaned or silently released. With a single client such a proxy
    tends to hand back the same backend, so a second connection (``probe``) holds a
    transaction open in between: through a proxy it is given the backend the first one just
    used, or the first one is moved to another; on a direct connection neither can happen."""
    with conn.transaction():
        first = backend_pid_now(conn)
    with probe.transaction():
        other = backend_pid_now(probe)
        with conn.transaction():
            second = backend_pid_now(conn)
    return first == second and other != first


def backend_pid(conn: sa.Connection | psycopg.Connection | psycopg.AsyncConnection) -> int:
    """The server process of a connection's session, as libpq learnt it at connect (no round
    trip). Behind a transaction-pooling proxy it may not be the one serving the transaction:
    ``backend_pid_now`` asks."""
    if isinstance(conn, psycopg.AsyncConnection):
        return int(conn.info.backend_pid)
    return int(driver(conn).info.backend_pid)


def backend_pid_now(conn: psycopg.Connection) -> int:
    """The backend serving this transaction, asked of the server: behind a transaction-pooling
    proxy it can differ from transaction to transaction (``session_is_pinned``), unlike the
    pid libpq learnt at connect (``backend_pid``)."""
    return one_row(conn.execute("SELECT pg_backend_pid()"))[0]


def backend_terminate(conn: sa.Connection | psycopg.Connection, pid: int) -> bool:
    """End backend ``pid`` (a stalled leader's lock session: its lock goes with it)."""
    return bool(one_row(driver(conn).execute(
        "SELECT pg_terminate_backend(%(pid)s)", {"pid": pid}))[0])


def handler_session_terminate(conn: sa.Connection, pid: int, wait_ms: int = 5000) -> bool:
    """End a handler process's session and wait (up to ``wait_ms``) until it is gone, its
    transaction rolled back; False when it had already ended (or outlived the wait). Only a
    session of a handler process: a pid the server has since given to another client's
    session is left alone."""
    row = driver(conn).execute(
        """
        SELECT pg_terminate_backend(pid, %(ms)s) FROM pg_stat_activity
        WHERE pid = %(pid)s AND application_name = %(app)s
        """,
        {"pid": pid, "ms": wait_ms, "app": HANDLER_APPLICATION},
    ).fetchone()
    return bool(row and row[0])


async def async_job_connection(
    engine: sa.Engine, schema: str, application_name: str = "cronkeeper-worker"
) -> psycopg.AsyncConnection:
    """A new async connection to the engine's database, its search_path on ``schema``."""
    info = conninfo(engine.url, options=f"-c search_path={check_schema_name(schema)}")
    with translate_errors("opening the job's async connection"):
        return await psycopg.AsyncConnection.connect(
            info, application_name=application_name, connect_timeout=10
        )


def async_connection_reusable(conn: psycopg.AsyncConnection) -> bool:
    """Open, not broken, and outside any transaction: fit for the next job's transaction."""
    return (not conn.closed and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)


def async_connection_drop(conn: psycopg.AsyncConnection) -> None:
    """Close an async connection's socket without its event loop (one that will not run again):
    the server rolls its transaction back."""
    with contextlib.suppress(Exception):
        conn.pgconn.finish()
