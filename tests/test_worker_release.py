"""A job the drain releases (SIGTERM's drain timeout) before its handler started must never
start: released, it is `available` again for another worker, and a handler starting here too
runs it twice. The window: the job's thread reading its schedule version (its output limit)
when the claim loop could not (the database away just after the claim), which may wait as long
as the database does. Commands check for the release after reading theirs
(test_worker_commands); a task's handler, in thread or process isolation, did not. Real
PostgreSQL, a real worker object and a real lock on ``schedule_versions``; the drain is the
worker's own."""

from __future__ import annotations

import threading

import psycopg
import pytest
from handlers_for_tests import q, wait_until

import cronkeeper
from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.outbox_claims import outbox_claim
from cronkeeper.worker.loop import Worker
from cronkeeper.worker.runtime import Running, WorkerConfig


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_task_released_while_reading_its_version_never_starts(engine, schema, database_url,
                                                               tmp_path, isolation):
    started = tmp_path / "started"
    with engine.begin() as conn:
        version = conn.exec_driver_sql(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('report', 'feedfacefeedface', '{}', now(), 1) RETURNING id").scalar()
        job_id = cronkeeper.enqueue(conn, "tests.write_file", {"path": str(started)},
                                    key="report@1", schema=schema)
        conn.exec_driver_sql("UPDATE outbox SET schedule = 'report', version_id = %(v)s "
                             "WHERE id = %(i)s", {"v": version, "i": job_id})
    own = make_engine(normalize_url(database_url), schema, pool_size=4)
    worker = Worker(own, WorkerConfig(worker_id="w", schema=schema, isolation=isolation,
                                      imports=["handlers_for_tests"]))
    with own.begin() as conn:
        [job] = outbox_claim(conn, worker_id="w", limit=1, lease_margin=5.0,
                             tasks=["tests.write_file"])
    held = Running(job)
    worker.running[job.id] = held  # claimed; the claim loop's read of its version failed
    locker = psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        locker.execute(f'LOCK TABLE "{schema}".schedule_versions IN ACCESS EXCLUSIVE MODE')
        runner = threading.Thread(target=worker._execute, args=(held,))
        runner.start()
        wait_until(lambda: q(engine, "SELECT count(*) FROM pg_locks WHERE NOT granted AND "
                             "relation = to_regclass(%(t)s)", t=f'"{schema}".schedule_versions')
                   == [(1,)], 30, message="the job's thread waits for its schedule version")
        worker._drain()  # the drain's deadline has passed: the job is released
        assert held.released
        locker.rollback()  # the thread reads its version and goes on
        runner.join(30)
        assert not runner.is_alive()
    finally:
        locker.close()
        worker.pool.stop()
        own.dispose()
    assert not started.exists(), "the handler started after its job was released"
