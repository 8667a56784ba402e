"""Real `cronkeeper worker` processes against real PostgreSQL: leases, retries, dead letters,
timeouts, drain, serial schedules. Tests wait on rows in the database, never on fixed sleeps."""

from __future__ import annotations

import os
import signal

import pytest
from handlers_for_tests import q, spawn_worker, wait_until

import cronkeeper

FAST = {"base": 0.2, "factor": 2, "max": 5}


@pytest.fixture
def workers(spawned_workers):
    return spawned_workers


def one(engine, sql, **params):
    rows = q(engine, sql, **params)
    return rows[0] if rows else None


def add(engine, schema, task, payload=None, key=None, **kw):
    with engine.begin() as conn:
        return cronkeeper.enqueue(conn, task, payload or {}, key=key or f"{task}:{os.urandom(4).hex()}",
                                  schema=schema, **kw)


def test_killed_worker_job_finished_by_another_after_lease(engine, schema, runs, workers):
    job = add(engine, schema, "log_runs", {"sleep": 30}, key="long", timeout=2.0)
    first = workers("--lease-margin", "1", "--instance-id", "first")
    wait_until(lambda: q(engine, "SELECT 1 FROM attempts WHERE job_id = %(i)s", i=job),
               message="first worker claimed the job")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    workers("--lease-margin", "1", "--instance-id", "second")
    wait_until(lambda: one(engine, "SELECT state FROM outbox WHERE id = %(i)s", i=job)[0] != "running"
               and len(q(engine, "SELECT 1 FROM attempts WHERE job_id = %(i)s", i=job)) >= 2, 30)
    rows = q(engine, "SELECT attempt, worker_id, outcome FROM attempts WHERE job_id = %(i)s "
             "ORDER BY attempt", i=job)
    assert rows[0] == (1, "first", "lease_expired")
    assert rows[1][1] == "second"


def test_retry_with_growing_jittered_delays_then_dead_letter(engine, schema, workers):
    job = add(engine, schema, "always_fails", key="flaky", max_attempts=4, backoff=FAST)
    workers()
    wait_until(lambda: one(engine, "SELECT state FROM outbox WHERE id = %(i)s", i=job) == ("dead",), 30)
    rows = q(engine, "SELECT attempt, started_at, finished_at, outcome FROM attempts "
             "WHERE job_id = %(i)s ORDER BY attempt", i=job)
    assert [r[3] for r in rows] == ["retry", "retry", "retry", "dead"]
    gaps = [(rows[n + 1][1] - rows[n][2]).total_seconds() for n in range(3)]
    ceilings = [0.2, 0.4, 0.8]
    assert all(g <= c + 0.5 for g, c in zip(gaps, ceilings, strict=True)), gaps
    state, attempts, error = one(engine, "SELECT state, attempts, last_error FROM outbox WHERE id = %(i)s", i=job)
    assert (state, attempts) == ("dead", 4)
    assert "503" in error and "attempt 4 of 4" in error


def test_permanent_error_dead_letters_on_first_attempt(engine, schema, workers):
    perm = add(engine, schema, "permanent", key="perm")
    unknown = add(engine, schema, "no.such.task", key="unknown")
    shape = add(engine, schema, "typed", {"invoice_id": "not a number"}, key="shape")
    unmarked = add(engine, schema, "handlers_for_tests:not_a_handler", key="unmarked")
    workers()
    ids = [perm, unknown, shape, unmarked]
    wait_until(lambda: all(one(engine, "SELECT state FROM outbox WHERE id = %(i)s", i=i) == ("dead",)
                           for i in ids), 20)
    for i in ids:
        assert one(engine, "SELECT attempts FROM outbox WHERE id = %(i)s", i=i) == (1,)
        assert q(engine, "SELECT outcome FROM attempts WHERE job_id = %(i)s", i=i) == [("dead",)]


def test_poison_job_does_not_block_the_jobs_behind_it(engine, schema, workers):
    add(engine, schema, "always_fails", key="poison", max_attempts=100, backoff={"base": 0, "factor": 1, "max": 0})
    for n in range(50):
        add(engine, schema, "noop", key=f"behind:{n}")
    workers("--concurrency", "2")
    wait_until(lambda: one(engine, "SELECT count(*) FROM outbox WHERE task = 'noop' "
                                   "AND state = 'succeeded'") == (50,), 20)


def test_command_past_timeout_is_killed_with_its_children(engine, schema, workers, tmp_path, command_schedule):
    pid_file = tmp_path / "grandchild.pid"
    schedules, job = command_schedule(["tests/bin/with_grandchild", str(pid_file)], timeout="2s")
    workers("--schedules", schedules, "--kill-grace", "0.5")
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 20)
    grandchild = int(pid_file.read_text())
    wait_until(lambda: q(engine, "SELECT outcome FROM attempts WHERE job_id = %(i)s AND outcome IS NOT NULL",
                         i=job), 20)
    assert q(engine, "SELECT outcome FROM attempts WHERE job_id = %(i)s AND attempt = 1", i=job) == [("timeout",)]
    wait_until(lambda: not _alive(grandchild), 5, message="grandchild gone")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_drains_then_releases_the_rest(engine, schema, runs, workers):
    quick = add(engine, schema, "log_runs", {"sleep": 0.5}, key="quick")
    slow = add(engine, schema, "log_runs", {"sleep": 60}, key="slow", timeout=120)
    proc = workers("--drain-timeout", "2", "--instance-id", "drainer")
    wait_until(lambda: len(q(engine, "SELECT 1 FROM attempts")) == 2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert one(engine, "SELECT state FROM outbox WHERE id = %(i)s", i=quick) == ("succeeded",)
    state, leased, lease = one(engine, "SELECT state, leased_by, lease_expires_at FROM outbox "
                                       "WHERE id = %(i)s", i=slow)
    assert (state, leased, lease) == ("available", None, None)
    assert q(engine, "SELECT outcome FROM attempts WHERE job_id = %(i)s", i=slow) == [("released",)]


def test_serial_schedule_never_runs_two_at_once(engine, schema, runs, workers):
    with engine.begin() as conn:
        for n in range(6):
            conn.exec_driver_sql(
                "INSERT INTO outbox (idempotency_key, schedule, task, payload, serial) "
                "VALUES (%(k)s, 'one-at-a-time', 'log_runs', '{\"sleep\": 0.3}', true)", {"k": f"s{n}"})
    for n in range(3):
        workers("--concurrency", "4", "--instance-id", f"serial-{n}")
    wait_until(lambda: one(engine, "SELECT count(*) FROM outbox WHERE state = 'succeeded'") == (6,), 30)
    spans = q(engine, "SELECT started_at, finished_at FROM attempts ORDER BY started_at")
    assert len(spans) == 6
    for earlier, later in zip(spans, spans[1:], strict=False):
        assert later[0] >= earlier[1], "two jobs of one serial schedule overlapped"


def test_limit_caps_a_task_per_worker(engine, schema, runs, workers):
    for n in range(6):
        add(engine, schema, "log_runs", {"sleep": 0.4}, key=f"lim:{n}")
    workers("--concurrency", "10", "--limit", "log_runs=1")
    wait_until(lambda: one(engine, "SELECT count(*) FROM outbox WHERE state = 'succeeded'") == (6,), 30)
    spans = q(engine, "SELECT started_at, finished_at FROM attempts ORDER BY started_at")
    for earlier, later in zip(spans, spans[1:], strict=False):
        assert later[0] >= earlier[1]


def test_worker_registers_and_heartbeats(engine, schema, workers, cluster):
    proc = spawn_worker(engine.url.render_as_string(hide_password=False), schema, cluster=cluster)
    try:
        wait_until(lambda: q(engine, "SELECT kind, role FROM instances WHERE cluster = %(c)s", c=cluster))
        assert q(engine, "SELECT kind, role FROM instances WHERE cluster = %(c)s", c=cluster) == [("worker", "worker")]
        first = one(engine, "SELECT heartbeat_at FROM instances WHERE cluster = %(c)s", c=cluster)[0]
        wait_until(lambda: one(engine, "SELECT heartbeat_at FROM instances WHERE cluster = %(c)s",
                               c=cluster)[0] > first, 15)
    finally:
        proc.kill()
        proc.wait()
