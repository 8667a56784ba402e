"""The soak's checks are not vacuous: each one fails on the violation it exists to catch,
written into a real schema by hand (a doubled effect, a completion by an attempt that had lost
its lease, a job left running, an order whose job is missing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from daemon_harness import set_path, shared_postgres

import cronkeeper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from soak_checks import check_effects, check_fence, check_jobs  # noqa: E402


@pytest.fixture
def db():
    pg = shared_postgres()
    schema = pg.new_schema()
    conn = set_path(pg.connect(), schema)
    conn.execute("CREATE TABLE app_orders (key text PRIMARY KEY)")
    conn.execute("CREATE TABLE soak_effects (job_key text NOT NULL, worker_id text NOT NULL,"
                 " attempt int NOT NULL, pid int NOT NULL)")
    conn.execute("CREATE TABLE soak_completions (job_key text NOT NULL, worker_id text NOT NULL,"
                 " attempt int NOT NULL)")
    yield conn, schema
    conn.close()


def job(conn, schema: str, key: str, state: str, attempts: list[tuple[str, str]]) -> int:
    """An enqueued job whose attempts (worker, outcome) are recorded as given."""
    with conn.transaction():
        conn.execute("INSERT INTO app_orders (key) VALUES (%s)", (key,))
        job_id = cronkeeper.enqueue(conn, "soak.work", {}, key=key, schema=schema)
    for n, (worker, outcome) in enumerate(attempts, start=1):
        conn.execute("INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at,"
                     " outcome) VALUES (%s, %s, %s, now(), now(), %s)", (job_id, n, worker, outcome))
    conn.execute("UPDATE outbox SET state = %s, attempts = %s, last_error = 'x' WHERE id = %s",
                 (state, len(attempts), job_id))
    return job_id


def effect(conn, key: str, worker: str, attempt: int) -> None:
    conn.execute("INSERT INTO soak_effects VALUES (%s, %s, %s, 1)", (key, worker, attempt))


def completion(conn, key: str, worker: str, attempt: int) -> None:
    conn.execute("INSERT INTO soak_completions VALUES (%s, %s, %s)", (key, worker, attempt))


def test_clean_records_pass(db, tmp_path):
    conn, schema = db
    job(conn, schema, "app:1", "succeeded", [("w1", "lease_expired"), ("w2", "succeeded")])
    effect(conn, "app:1", "w2", 2)
    completion(conn, "app:1", "w2", 2)
    assert check_effects(conn, tmp_path).ok and check_fence(conn, []).ok and check_jobs(conn).ok


def test_a_doubled_effect_fails(db, tmp_path):
    conn, schema = db
    job(conn, schema, "app:1", "succeeded", [("w1", "succeeded")])
    effect(conn, "app:1", "w1", 1)
    effect(conn, "app:1", "w1", 1)
    assert not check_effects(conn, tmp_path).ok


def test_a_completion_by_the_attempt_that_lost_its_lease_fails(db):
    conn, schema = db
    job(conn, schema, "app:1", "succeeded", [("w1", "lease_expired"), ("w2", "succeeded")])
    effect(conn, "app:1", "w2", 2)
    completion(conn, "app:1", "w2", 2)
    completion(conn, "app:1", "w1", 1)  # w1 committed after its lease was reaped and w2 took over
    result = check_fence(conn, [])
    assert not result.ok and "'w1', 1" in result.detail


def test_a_succeeded_job_whose_completion_never_committed_fails(db):
    """The job is marked succeeded, but no handler transaction committed with it."""
    conn, schema = db
    job(conn, schema, "app:1", "succeeded", [("w1", "succeeded")])
    assert not check_fence(conn, []).ok


def test_a_job_left_running_or_an_order_without_its_job_fails(db):
    conn, schema = db
    job(conn, schema, "app:1", "running", [("w1", None)])
    assert not check_jobs(conn).ok
    conn.execute("DELETE FROM outbox")
    conn.execute("DELETE FROM attempts")
    assert check_jobs(conn).ok is False  # the order app:1 now has no job
