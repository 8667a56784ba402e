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
    claim loop and the recorder) two waited for others to finish; held past the pool's 30 s
    timeout (not waited for here), that wait left the supervisor without a connection and its
    thread died (reproduced by hand on 2026-12-05, see the CHANGELOG)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE held (key text NOT NULL, at timestamptz NOT NULL)")
    ids = enqueue_many(engine, schema, "holds_its_transaction", {"sleep": 3}, 10, "hold")
    proc = spawn_worker(database_url, schema, "--concurrency", "10")
    try:
        wait_until(lambda: succeeded(engine, ids) == 10, 60,
                   message="ten handlers holding their transactions to succeed")
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


def test_an_output_written_apart_gives_its_connection_back(engine, database_url, schema):
    """What the test above guards, at the root: ``record_output`` on a runner thread gives its
    connection back to the pool (``statement`` kept one for the calling thread for ever, and
    with every runner keeping one the former pool emptied), and the output is stored."""
    import threading

    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.outbox_claims import outbox_claim
    from cronkeeper.output import Capture
    from cronkeeper.worker.execute import record_output
    from cronkeeper.worker.loop import Worker
    from cronkeeper.worker.runtime import Running, WorkerConfig

    [job_id] = enqueue_many(engine, schema, "t.apart", {}, 1, "apart")
    own = make_engine(normalize_url(database_url), schema, pool_size=2)
    try:
        worker = Worker(own, WorkerConfig(worker_id="w", schema=schema))
        with own.connect() as conn:
            worker.output_column.check(conn)
        with own.begin() as conn:
            [job] = outbox_claim(conn, worker_id="w", limit=1, lease_margin=30, tasks=["t.apart"])
        assert worker.output_column.present and job.id == job_id
        held = Running(job)
        held.capture = Capture(1024)
        held.capture.feed(b"written apart\n")
        written, leave = threading.Event(), threading.Event()

        def runner_thread() -> None:  # a runner lives on after the job: so does what it keeps
            record_output(worker, held)
            written.set()
            leave.wait(30)

        runner = threading.Thread(target=runner_thread)
        runner.start()
        try:
            assert written.wait(30)
            assert own.pool.checkedout() == 0, "the runner thread kept its connection"
        finally:
            leave.set()
            runner.join(30)
    finally:
        own.dispose()
    assert q(engine, "SELECT output FROM attempts WHERE job_id = %(j)s", j=job_id) == [
        (b"written apart\n",)]


def test_a_pool_with_no_connection_free_is_an_outage_not_a_crash(database_url, schema):
    """The pool's timeout (no connection free) is a DatabaseError, as an unreachable server's
    is, with a message that says the server is not the cause; the callers' handling of a
    DatabaseError (the supervisor's and the claim loop's retry) then applies to it. Before,
    SQLAlchemy's TimeoutError escaped and ended the thread it hit."""
    import sqlalchemy as sa

    from cronkeeper.claiming import ClaimingDatabase
    from cronkeeper.db.engine import normalize_url
    from cronkeeper.errors import DatabaseError

    engine = sa.create_engine(normalize_url(database_url), pool_size=1, max_overflow=0,
                              pool_timeout=0.2)
    db = ClaimingDatabase(engine)
    try:
        with engine.connect():  # the pool's one connection, taken
            with (pytest.raises(DatabaseError, match="no connection free in this process's pool"),
                  db.transaction("extending leases") as conn):
                conn.exec_driver_sql("SELECT 1")
            with (pytest.raises(DatabaseError, match="QueuePool limit"),
                  db.statement("claiming jobs") as conn):
                conn.exec_driver_sql("SELECT 1")
        with db.transaction("extending leases") as conn:  # free again: works at once
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        engine.dispose()


def test_the_supervisor_extends_leases_through_an_error_of_its_other_step(engine, database_url,
                                                                          schema, caplog):
    """The supervisor's two steps are apart: its handler timeouts failing on every pass (here
    made to raise) neither kill its thread nor stop the heartbeat, which goes on extending the
    lease of the job held; the error is logged once, with its traceback, not at every pass."""
    import logging
    import threading

    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.outbox_claims import outbox_claim
    from cronkeeper.worker.loop import Worker
    from cronkeeper.worker.runtime import Running, WorkerConfig

    with engine.begin() as conn:  # a 1 s timeout: its lease (timeout + margin) soon needs a beat
        job_id = cronkeeper.enqueue(conn, "t.held", {}, key="held", schema=schema, timeout=1)
    own = make_engine(normalize_url(database_url), schema, pool_size=3)
    worker = Worker(own, WorkerConfig(worker_id="w", schema=schema, lease_margin=0.9))
    with own.begin() as conn:
        [job] = outbox_claim(conn, worker_id="w", limit=1, lease_margin=0.9, tasks=["t.held"])
    worker.running[job.id] = Running(job)

    def lease() -> object:
        return q(engine, "SELECT lease_expires_at FROM outbox WHERE id = %(i)s", i=job_id)[0][0]

    def broken(now: float) -> None:
        raise KeyError(f"timing out at {now}")  # a different message at every pass

    worker.supervisor._time_out_tasks = broken  # type: ignore[method-assign]
    first = lease()
    loop = threading.Thread(target=worker.supervisor.loop)
    with caplog.at_level(logging.ERROR, logger="cronkeeper.worker"):
        loop.start()
        try:
            wait_until(lambda: lease() > first, 10, message="the lease extended")
            second = lease()
            wait_until(lambda: lease() > second, 10, message="the lease extended again")
            assert loop.is_alive()
        finally:
            worker.recorder_done.set()
            loop.join(10)
            own.dispose()
    errors = [r for r in caplog.records if getattr(r, "action", None) == "internal_error"]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "timing out handlers failed: KeyError" in errors[0].getMessage()
