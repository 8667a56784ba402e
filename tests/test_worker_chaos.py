"""Three workers drain 5,000 jobs while one of them is SIGKILLed every few seconds (and
restarted): no job is lost, none completes twice, and each effect happens once.

Each job sleeps 0.15 s, so three workers of 20 threads cannot drain the queue in less than
about 12 s however fast claims get: the kills (every 2.5 s until 90% are done) always land
mid-drain."""

from __future__ import annotations

import signal
import time

import pytest
from handlers_for_tests import spawn_worker

JOBS = 5000


@pytest.mark.timeout(240)
def test_sigkill_one_of_three_workers_every_few_seconds(engine, schema, database_url):
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE runs (key text NOT NULL, pid integer NOT NULL)")
        conn.exec_driver_sql(
            "INSERT INTO outbox (idempotency_key, task, timeout_seconds) "
            "SELECT 'chaos:' || i, 'count', 2 FROM generate_series(1, %(n)s) i", {"n": JOBS})
        conn.exec_driver_sql("UPDATE outbox SET payload = '{\"sleep\": 0.15}'")
    args = ("--lease-margin", "1", "--concurrency", "20", "--batch-size", "50")
    workers = [spawn_worker(database_url, schema, *args) for _ in range(3)]
    kills = 0
    started = time.monotonic()

    def done() -> int:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT count(*) FROM outbox WHERE state = 'succeeded'").scalar()

    try:
        victim = 0
        next_kill = time.monotonic() + 2.0
        while done() < JOBS:
            assert time.monotonic() - started < 150, f"not drained in 150 s ({done()} of {JOBS})"
            if time.monotonic() >= next_kill and done() < JOBS * 0.9:
                workers[victim].send_signal(signal.SIGKILL)
                workers[victim].wait(10)
                kills += 1
                workers[victim] = spawn_worker(database_url, schema, *args)
                victim = (victim + 1) % 3
                next_kill = time.monotonic() + 2.5
            time.sleep(0.2)
    finally:
        for w in workers:
            w.kill()
            w.wait(10)
    assert kills >= 2
    with engine.connect() as conn:
        states = conn.exec_driver_sql("SELECT state, count(*) FROM outbox GROUP BY state").all()
        twice = conn.exec_driver_sql(
            "SELECT job_id FROM attempts WHERE outcome = 'succeeded' GROUP BY job_id "
            "HAVING count(*) > 1").all()
        effects = conn.exec_driver_sql("SELECT count(*), count(DISTINCT key) FROM runs").one()
        lost = conn.exec_driver_sql("SELECT count(*) FROM attempts WHERE outcome = 'lease_expired'").scalar()
    assert states == [("succeeded", JOBS)]
    assert twice == []
    assert tuple(effects) == (JOBS, JOBS)
    print(f"kills={kills} lease_expired_attempts={lost} seconds={time.monotonic() - started:.1f}")
