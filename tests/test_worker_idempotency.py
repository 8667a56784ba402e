"""Duplicate delivery runs an effect once; follow-up jobs commit with their parent; explain;
cronkeeper.testing used on our own handlers."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import handlers_for_tests as h
from handlers_for_tests import cronkeeper_exe, spawn_worker, wait_until

import cronkeeper
from cronkeeper import testing


def count_runs(engine):
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT count(*) FROM runs").scalar()


def test_testing_helper_concurrent_duplicate_runs_effect_once(engine, schema, runs):
    testing.assert_runs_once(h.count, {"sleep": 0.2}, engine=engine, schema=schema,
                             key="dup@2026-01-01T00:00:00Z", count=lambda: count_runs(engine),
                             concurrently=True)
    testing.assert_runs_once(h.count, {}, engine=engine, schema=schema, key="seq@1",
                             count=lambda: count_runs(engine))


def test_testing_helper_classifies_failures(engine, schema, monkeypatch):
    assert testing.classify(h.always_fails, {}).retryable
    testing.assert_permanent(h.permanent, {})
    testing.assert_permanent(h.typed, {"invoice_id": "x"})
    monkeypatch.setattr(h.time, "sleep", testing.raises(TimeoutError("gateway timeout")))
    testing.assert_retryable(h.sleepy, {"sleep": 1})
    monkeypatch.setattr(h.time, "sleep", testing.raises(cronkeeper.PermanentError("gone")))
    testing.assert_permanent(h.sleepy, {"sleep": 1})


def test_same_job_on_two_workers_at_once_runs_its_effect_once(engine, schema, runs, database_url):
    """Worker A is frozen mid-job; its lease expires; B runs the job; A resumes and finishes
    its run too. Both delivered the job; the effect happened once."""
    with engine.begin() as conn:
        job = cronkeeper.enqueue(conn, "count", {"sleep": 1.5}, key="both@1", schema=schema, timeout=60)
    a = spawn_worker(database_url, schema, "--lease-margin", "1", "--instance-id", "A")
    b = None
    try:
        wait_until(lambda: _attempts(engine, job), 20)
        a.send_signal(signal.SIGSTOP)
        with engine.begin() as conn:  # make the frozen worker's lease run out now
            conn.exec_driver_sql("UPDATE outbox SET lease_expires_at = now() WHERE id = %(i)s", {"i": job})
        b = spawn_worker(database_url, schema, "--lease-margin", "1", "--instance-id", "B")
        try:
            wait_until(lambda: _state(engine, job) == "succeeded", 30)
        finally:
            a.send_signal(signal.SIGCONT)
        wait_until(lambda: b.poll() is None and _attempt_rows(engine, job)[0][2] == "lease_expired", 10)
        a.send_signal(signal.SIGTERM)
        assert a.wait(30) == 0
    finally:
        for proc in (a, b):  # a failed wait must not leave a worker running (or frozen)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    assert count_runs(engine) == 1
    assert [r[1] for r in _attempt_rows(engine, job)] == ["A", "B"]


def _state(engine, job):
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT state FROM outbox WHERE id = %(i)s", {"i": job}).scalar()


def _attempts(engine, job):
    return _attempt_rows(engine, job)


def _attempt_rows(engine, job):
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT attempt, worker_id, outcome FROM attempts WHERE job_id = "
                                    "%(i)s ORDER BY attempt", {"i": job}).all()


def test_follow_up_jobs_commit_with_completion_and_explain(engine, schema, runs, database_url):
    with engine.begin() as conn:
        cronkeeper.enqueue(conn, "paginate", {"cursor": 1, "last": 4}, key="page:1", schema=schema)
    w = spawn_worker(database_url, schema)
    try:
        wait_until(lambda: _state_by_key(engine, "page:4") == "succeeded", 20)
    finally:
        w.kill()
        w.wait()
    assert count_runs(engine) == 4
    out = subprocess.run([cronkeeper_exe(), "explain", "page:3", "--database-url", database_url,
                          "--schema", schema, "--format", "json"], capture_output=True, text=True)
    story = json.loads(out.stdout)
    assert story["final_state"] == "succeeded"
    assert [a["outcome"] for a in story["attempts"]] == ["succeeded"]
    text = subprocess.run([cronkeeper_exe(), "explain", "page:3", "--database-url", database_url,
                           "--schema", schema], capture_output=True, text=True).stdout
    assert "attempt 1: succeeded" in text and "final state: succeeded" in text
    missing = subprocess.run([cronkeeper_exe(), "explain", "nope@2026-01-01T00:00:00Z", "--database-url",
                              database_url, "--schema", schema], capture_output=True, text=True)
    assert missing.returncode == 1 and "nothing recorded" in missing.stderr


def _state_by_key(engine, key):
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT state FROM outbox WHERE idempotency_key = %(k)s",
                                    {"k": key}).scalar()


def test_a_lost_lease_is_logged_once_per_attempt(engine, schema, runs, database_url):
    """Another worker takes the job (its lease is now someone else's) while this worker's
    handler still runs for seconds: the heartbeat keeps failing to extend it, and says so once,
    not at every heartbeat (three a second here)."""
    with engine.begin() as conn:
        job = cronkeeper.enqueue(conn, "count", {"sleep": 4}, key="lost@1", schema=schema, timeout=60)
    a = spawn_worker(database_url, schema, "--lease-margin", "1", "--instance-id", "A")
    try:
        wait_until(lambda: _attempts(engine, job), 20)
        with engine.begin() as conn:  # the lease passes to B, as after an expiry
            conn.exec_driver_sql("UPDATE outbox SET leased_by = 'B' WHERE id = %(i)s", {"i": job})
        time.sleep(2.5)  # six heartbeats or so while the handler sleeps on
        a.send_signal(signal.SIGTERM)  # a graceful stop waits for the handler to end
        assert a.wait(30) == 0
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    err = a.stderr.read()
    lines = [x for x in err.splitlines() if "lease lost: job=" in x]
    beats = [x for x in lines if f"job={job} key=lost@1 attempt=1 " in x]  # the heartbeat's
    assert len(beats) == 1, err
    assert any("handler's transaction rolled back" in x for x in lines), err
    assert count_runs(engine) == 0  # its completion was refused: the effect rolled back with it
