"""The worker's connections (docs/worker.md, "Choosing --concurrency"; docs/operations.md,
"How many connections"): its pool holds a connection for
every runner beside its own threads', so handlers holding their jobs' transactions never starve
each other or the heartbeat; no runner thread keeps a connection of its own, so jobs whose
output is written apart (a handler process's own commit) never empty the pool. Real workers,
real PostgreSQL."""

from __future__ import annotations

import pytest
from handlers_for_tests import q, spawn_worker, wait_until

import cronkeeper


def enqueue_many(engine, schema: str, task: str, payload: dict, n: int, prefix: str) -> list[int]:
    with engine.begin() as conn:
        return [cronkeeper.enqueue(conn, task, payload, key=f"{prefix}-{i}", schema=schema)
                for i in range(n)]


def succeeded(engine, ids: list[int]) -> int:
    return q(engine, "SELECT count(*) FROM outbox WHERE id = ANY(%(i)s) AND state = 'succeeded'",
             i=ids)[0][0]


def test_every_runner_holds_its_jobs_transaction_at_once(engine, schema, database_url):
    """Ten handlers (the default concurrency) each holding their transaction for 3 s all get
    their connection at once. With the former pool (5 and 5 more, two of them kept by the
    claim loop and the recorder) two waited for others to finish, and a handler holding its
    transaction past the pool's 30 s timeout left the supervisor without one: its heartbeat
    thread died and every lease lapsed."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE held (key text NOT NULL, at timestamptz NOT NULL)")
    ids = enqueue_many(engine, schema, "holds_its_transaction", {"sleep": 3}, 10, "hold")
    proc = spawn_worker(database_url, schema, "--concurrency", "10")
    try:
        wait_until(lambda: succeeded(engine, ids) == 10, 60,
                   message="ten handlers holding their transactions to succeed")
        # Heartbeats went on: each job's lease was extended while its handler held on.
        assert proc.poll() is None
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    spread = q(engine, "SELECT extract(epoch FROM max(at) - min(at)) FROM held")[0][0]
    assert spread < 2.0, f"handlers got their connections {spread:.1f} s apart"
    assert q(engine, "SELECT count(*) FROM attempts WHERE job_id = ANY(%(i)s)", i=ids)[0][0] == 10
    assert "Traceback" not in err and "QueuePool" not in err, err[-2000:]


def test_outputs_written_apart_never_empty_the_pool(engine, schema, database_url):
    """Process isolation, ten runners busy at once with handlers that commit their own
    transaction (each output then written by the worker beside it): when each runner kept the
    connection it wrote with, ten of them and the claim loop's and recorder's emptied the pool,
    the next write waited 30 s and the worker stopped ("QueuePool limit ... reached")."""
    ids = enqueue_many(engine, schema, "output.log_in_transaction", {"sleep": 0.1}, 300, "apart")
    proc = spawn_worker(database_url, schema, "--import", "handlers_output", "--isolation",
                        "process", "--concurrency", "10")
    try:
        wait_until(lambda: succeeded(engine, ids) == 300, 120, message="300 own-commit jobs")
        wait_until(lambda: q(engine, "SELECT count(output) FROM attempts WHERE job_id = ANY(%(i)s)",
                             i=ids)[0][0] == 300, 30, message="their 300 outputs")
        assert proc.poll() is None
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert "QueuePool" not in err and "internal error" not in err, err[-2000:]


def test_a_pool_with_no_connection_free_is_an_outage_not_a_crash(database_url, schema):
    """The pool's timeout (no connection free) is a DatabaseError, as an unreachable server's
    is: the supervisor and the claim loop wait and retry, a handler's attempt fails and is
    retried; before, SQLAlchemy's TimeoutError escaped and ended the thread it hit."""
    import sqlalchemy as sa

    from cronkeeper.claiming import ClaimingDatabase
    from cronkeeper.db.engine import normalize_url
    from cronkeeper.errors import DatabaseError

    engine = sa.create_engine(normalize_url(database_url), pool_size=1, max_overflow=0,
                              pool_timeout=0.2)
    db = ClaimingDatabase(engine)
    try:
        with engine.connect():  # the pool's one connection, taken
            with (pytest.raises(DatabaseError, match="QueuePool limit"),
                  db.transaction("extending leases") as conn):
                conn.exec_driver_sql("SELECT 1")
            with (pytest.raises(DatabaseError, match="QueuePool limit"),
                  db.statement("claiming jobs") as conn):
                conn.exec_driver_sql("SELECT 1")
        with db.transaction("extending leases") as conn:  # free again: works at once
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        engine.dispose()
