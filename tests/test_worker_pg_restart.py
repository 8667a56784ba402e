"""PostgreSQL crashes (``pg_ctl stop -m immediate``) and starts again while a worker runs short
jobs whose effect no rollback can take back (a line appended to a file), issue 21 §5.

Jobs that end while the server is down keep their endings in the worker's memory, and their
leases held; the endings are written as soon as the server answers, each with the instant its
attempt ended, fenced as ever. So, after the restart: every job succeeded on its first and only
attempt, each effect happened once, and the attempts that ended during the outage say so
(``finished_at`` before the server started again), which the recording instant would not.

Two lease lengths: the default timeout (10 minutes: before, these endings were written only by
luck of the reconnect backoff, and a job whose ending was lost stayed ``running`` until its
lease ran out, then ran again), and leases shorter than the outage, which run out while the
server is down: the reaper leaves them one lease margin after the start, the holder renews them
and records its endings, and no job runs twice.

A private PostgreSQL per test (tests/daemon_harness.py): the shared service is never restarted.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from daemon_harness import PrivatePostgres, db_now, set_path, wait_for
from handlers_for_tests import spawn_worker

import cronkeeper
from cronkeeper.db.engine import make_engine, normalize_url

JOBS = 300


def sleep(i: int) -> float:
    """Job i's run: 0.1 to 0.5 s, so that the ten threads end their jobs at staggered instants
    and some are always running (equal runs would end, and be claimed, in waves: a crash in the
    gap between two waves would find no job running)."""
    return 0.1 + (i % 5) * 0.1


@pytest.fixture
def pg():
    server = PrivatePostgres().start()
    yield server
    server.stop()


def effects(path: Path) -> list[str]:
    """The keys of the effect lines written so far (a line is whole once its newline is)."""
    text = path.read_text()
    return [line.split("\t")[0] for line in text.splitlines(keepends=True) if line.endswith("\n")]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("lease", ["default", "shorter-than-the-outage"])
def test_endings_kept_through_a_crash_restart_are_recorded_at_once_and_nothing_runs_twice(
        pg, tmp_path, lease):
    schema = pg.new_schema()
    engine = make_engine(normalize_url(pg.url), schema, pool_size=1)
    timeout, margin = (600.0, 30.0) if lease == "default" else (1.0, 3.0)
    with engine.begin() as conn:
        for i in range(JOBS):
            cronkeeper.enqueue(conn, "append_effect", {"sleep": sleep(i)}, key=f"job-{i}",
                               schema=schema, timeout=timeout)
    engine.dispose()
    log = tmp_path / "effects.log"
    log.touch()
    worker = spawn_worker(pg.url, schema, "--concurrency", "10", "--lease-margin", str(margin),
                          env={"EFFECTS_LOG": str(log)})
    db = set_path(pg.connect(), schema)
    try:
        wait_for(lambda: len(effects(log)) >= 30, 60, "the worker to be running jobs")
        before_crash = db_now(db)
        db.close()
        pg.crash()
        down_from = len(effects(log))
        # Jobs held at the crash go on and end while the server is down.
        wait_for(lambda: len(effects(log)) >= down_from + 3, 30, "jobs ending while PostgreSQL is down")
        if lease != "default":
            # The length of the outage, not a wait for a race: past every lease the server knew
            # (the longest is a job claimed just before the crash: timeout + margin).
            time.sleep(timeout + margin + 0.5)
        ended_while_down = effects(log)[down_from:]
        pg.start()
        back = time.monotonic()
        db = set_path(pg.connect(), schema)
        started_at = db.execute("SELECT pg_postmaster_start_time()").fetchone()[0]

        wait_for(lambda: db.execute("SELECT count(*) FROM outbox WHERE idempotency_key = ANY(%s)"
                                    " AND state = 'succeeded'", (ended_while_down,))
                 .fetchone()[0] == len(ended_while_down), 60,
                 "the jobs that ended while PostgreSQL was down to be recorded")
        recorded_after = time.monotonic() - back
        wait_for(lambda: db.execute("SELECT count(*) FROM outbox WHERE state = 'succeeded'")
                 .fetchone()[0] == JOBS, 60, "every job to succeed")
        print(f"\n[{lease}] {len(ended_while_down)} jobs ended while PostgreSQL was down, recorded "
              f"{recorded_after:.2f}s after `pg_ctl start` returned; all {JOBS} succeeded "
              f"{time.monotonic() - back:.2f}s after")

        runs = Counter(effects(log))
        assert sorted(runs) == sorted(f"job-{i}" for i in range(JOBS)), "a job never ran"
        assert [k for k, n in runs.items() if n > 1] == [], "a job ran twice"
        attempts = db.execute("SELECT j.idempotency_key, a.attempt, a.outcome, a.finished_at"
                              " FROM attempts a JOIN outbox j ON j.id = a.job_id").fetchall()
        assert sorted((k, n, o) for k, n, o, _ in attempts) == sorted(
            (f"job-{i}", 1, "succeeded") for i in range(JOBS))
        finished = {k: f for k, _, _, f in attempts}
        # Recorded with the instant each attempt ended, not the instant the server came back.
        late = {k: finished[k] for k in ended_while_down
                if not before_crash < finished[k] < started_at}
        assert late == {}, f"ended while down, recorded as ending after the restart: {late}"
    finally:
        db.close()
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    assert "database unavailable" in err and "database reconnected" in err, err[-3000:]
    assert "lease lost" not in err, err[-3000:]


