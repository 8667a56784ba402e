"""Wake-ups, the receiving side, with real `cronkeeper worker` processes: with the poll set to
60 s, a job enqueued while the worker idles still runs promptly (LISTEN/NOTIFY), a job due in a
few seconds runs when it is due (the worker sleeps until the earliest run_after), and a LISTEN
session killed with pg_terminate_backend is re-established, logged, and the jobs enqueued
meanwhile run. No timing thresholds: each wait is far shorter than the 60 s poll, so a job that
ran within it was not picked up by the poll."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from handlers_for_tests import cronkeeper_exe, wait_until

import cronkeeper
from cronkeeper.worker.wakeups import APPLICATION_NAME

POLL = "60"  # far longer than any wait below
PROMPT = 20.0  # seconds a test waits for a job the wake-up should start


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def worker(database_url, schema, tmp_path):
    """Start one worker with JSON logs in a file; returns (process, log lines reader)."""
    procs: list[subprocess.Popen] = []

    def start(*args: str):
        log_path = tmp_path / f"worker-{len(procs)}.log"
        here = str(Path(__file__).parent)
        env = {**os.environ, "PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [cronkeeper_exe(), "worker", "--database-url", database_url, "--schema", schema,
                 "--import", "handlers_for_tests", "--poll-interval", POLL, "--log-format", "json",
                 "--metrics-address", "off", *args],
                env=env, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL)
        procs.append(proc)

        def actions() -> list[str]:
            lines = log_path.read_text().splitlines()
            return [json.loads(line).get("action", "") for line in lines if line.startswith("{")]

        return proc, actions

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture
def admin(database_url):
    conn = psycopg.connect(plain(database_url), autocommit=True)
    yield conn
    conn.close()


def listener_pids(admin, schema: str) -> list[int]:
    """Backends of this schema's worker LISTEN sessions that are listening."""
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query = %s",
        (APPLICATION_NAME, f'LISTEN "cronkeeper.{schema}"'),
    ).fetchall()
    return [r[0] for r in rows]


def add(engine, schema, key, **kw):
    with engine.begin() as conn:
        return cronkeeper.enqueue(conn, "noop", {}, key=key, schema=schema, **kw)


def attempted(engine, job_id) -> bool:
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT count(*) FROM attempts WHERE job_id = %(i)s AND outcome = 'succeeded'",
            {"i": job_id}).scalar() == 1


def test_idle_worker_runs_a_new_job_without_waiting_for_the_poll(engine, schema, worker, admin):
    proc, _ = worker()
    wait_until(lambda: listener_pids(admin, schema), PROMPT, message="the worker LISTENs")
    for n in range(3):  # idle again between jobs: each one is a fresh wake-up
        job = add(engine, schema, f"now-{n}")
        wait_until(lambda job=job: attempted(engine, job), PROMPT, message=f"job {n} ran")
    later = add(engine, schema, "later", run_after=timedelta(seconds=2))
    wait_until(lambda: attempted(engine, later), PROMPT,
               message="the job due in 2 s ran (the worker slept until its run_after)")
    assert proc.poll() is None


def test_killed_listen_session_is_reestablished_and_nothing_is_missed(engine, schema, worker, admin):
    proc, actions = worker()
    old = wait_until(lambda: listener_pids(admin, schema), PROMPT, message="the worker LISTENs")
    assert admin.execute("SELECT pg_terminate_backend(%s)", (old[0],)).fetchone()[0]
    # Committed at once: the worker waits at least 0.5 s before it reconnects, so this lands
    # while nobody listens; only the poke after the reconnect (or the 60 s poll) can find it.
    gap = add(engine, schema, "in-the-gap")
    wait_until(lambda: attempted(engine, gap), PROMPT, message="the job enqueued meanwhile ran")
    new = wait_until(lambda: [p for p in listener_pids(admin, schema) if p != old[0]], PROMPT,
                     message="a new LISTEN session")
    assert new and old[0] not in listener_pids(admin, schema)
    wait_until(lambda: "listen_restored" in actions(), PROMPT, message="the restore is logged")
    seen = actions()
    assert seen.index("listen_lost") < seen.index("listen_restored")
    after = add(engine, schema, "after")
    wait_until(lambda: attempted(engine, after), PROMPT, message="wake-ups work again")
    assert proc.poll() is None
