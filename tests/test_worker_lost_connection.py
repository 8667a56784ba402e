"""The job's connection is lost between the handler's return and the commit of its completion
(found by the soak: a PostgreSQL restart at that moment). Rolling back then fails too; that
second error escaped the worker's job thread, which died with the job still in the worker's
hands, so its lease was extended by every heartbeat and the job stayed `running` for as long
as the worker lived. The attempt must end as a retryable failure and the job run again.

The same for any error raised while a job is being ended (issue 19, "a latent bug"): the
worker's last guard (``Worker._execute``) called a method that did not exist, so its own
AttributeError killed the thread with the job held, as above."""

from __future__ import annotations

import subprocess

import pytest
from handlers_for_tests import spawn_worker, wait_until

import cronkeeper


@pytest.fixture
def worker(database_url, schema):
    procs: list[subprocess.Popen] = []
    yield lambda *a: procs.append(spawn_worker(database_url, schema, *a)) or procs[-1]
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def fails_once_then_succeeds(engine, schema, worker, task: str, key: str):
    """Run ``task`` (a handler that fails its first attempt while being ended) under a real
    worker until its second attempt succeeds; return the worker and the attempts' rows."""
    with engine.begin() as conn:
        job = cronkeeper.enqueue(conn, task, {}, key=key, schema=schema, timeout=30.0,
                                 backoff={"base": 0.1, "factor": 2, "max": 0.5})
    proc = worker("--lease-margin", "30")

    def state():
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT state, attempts FROM outbox WHERE id = %(i)s",
                                        {"i": job}).one()
    wait_until(lambda: state() == ("succeeded", 2), 30,
               message="the job to fail its first attempt and succeed on its second")
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT attempt, outcome, error FROM attempts"
                                    " WHERE job_id = %(i)s ORDER BY attempt", {"i": job}).all()
    assert [(a, o) for a, o, _ in rows] == [(1, "retry"), (2, "succeeded")]
    return proc, rows


def test_a_connection_lost_at_commit_fails_the_attempt_and_the_job_runs_again(engine, schema, worker):
    proc, rows = fails_once_then_succeeds(engine, schema, worker, "loses_its_connection",
                                          "lost-at-commit")
    assert "committing the job's transaction failed" in rows[0][2]
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and "Exception in thread" not in err, err[-2000:]


def test_an_error_while_ending_a_job_fails_the_attempt_and_the_job_runs_again(engine, schema, worker):
    proc, rows = fails_once_then_succeeds(engine, schema, worker, "rollback_hook_fails",
                                          "hook-refuses-rollback")
    assert "internal error ending the job" in rows[0][2]
    assert "the audit hook refused the rollback" in rows[0][2]
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and "Exception in thread" not in err, err[-2000:]
    assert "recording the end of job=" in err  # said once, as an error, with the job
