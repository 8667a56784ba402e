"""PostgreSQL crashes (``pg_ctl stop -m immediate``) while a leader writes a burst of 10,000
periods and a worker runs their jobs, and starts again (issue 21 §5).

The burst is a backlog: ten every-second schedules whose versions were recorded 1,000 s ago, so
the leader that starts has 10,000 periods to decide (catch_up), in fenced batches. The crash
is made as soon as the first batch is visible, so that the rest are being written or waiting:
a batch in flight is rolled back with the crash; every process reconnects by itself; a leader
(a new term) decides what no committed batch decided. Afterwards every period due is decided
exactly once (the audit), every job of the burst ends `succeeded`, and each ran once (one line
per key in the effects file, none twice).

A private PostgreSQL per test (tests/daemon_harness.py): the shared service is never restarted.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import timedelta

import pytest
from daemon_harness import (
    Daemon,
    PrivatePostgres,
    assert_audit_clean,
    audit,
    db_now,
    leader_row,
    record_versions,
    schedule_toml,
    set_path,
    wait_for,
    write_schedules,
)
from handlers_for_tests import spawn_worker

SCHEDULES = 10
BACKLOG = 1000  # seconds of every-second periods per schedule: 10,000 periods due at start


@pytest.fixture
def pg():
    server = PrivatePostgres().start()
    yield server
    server.stop()


@pytest.mark.timeout(240)
def test_a_crash_restart_during_a_burst_of_10000_periods_decides_each_once_and_runs_each_once(
        pg, tmp_path):
    schema = pg.new_schema()
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    directory = write_schedules(tmp_path / "s", {f"s{i}.toml": schedule_toml(
        f"s{i}", every="1s", catch_up_limit="24h", task="append_effect") for i in range(SCHEDULES)})
    record_versions(pg, schema, directory, timedelta(seconds=BACKLOG))
    effects = tmp_path / "effects.log"
    effects.touch()
    daemons = [Daemon(url=pg.url, schema=schema, cluster=cluster, schedules=directory,
                      instance_id=f"node{i}", log_dir=tmp_path, leader_timeout=30,
                      stall_timeout=30) for i in range(2)]
    worker = spawn_worker(pg.url, schema, "--concurrency", "10",
                          env={"EFFECTS_LOG": str(effects)}, cluster=cluster)
    db = set_path(pg.connect(), schema)
    try:
        for d in daemons:
            d.start()
        first = wait_for(lambda: db.execute("SELECT count(*) FROM periods").fetchone()[0], 60,
                         "the first batch of the burst")
        pg.crash()
        db.close()
        pg.start()
        db = set_path(pg.connect(), schema)
        back = db_now(db)
        # (a daemon may win before this test has reconnected: the server's start is the bound)
        started_at = db.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
        kept = db.execute("SELECT count(*) FROM periods").fetchone()[0]
        print(f"\ncrash with {first} periods visible, {kept} after crash recovery")
        assert first <= kept < SCHEDULES * BACKLOG  # nothing committed lost; the burst cut short

        leader = wait_for(lambda: (r := leader_row(db, cluster)) and r.since > started_at and r, 60,
                          "a leader after the restart")
        wait_for(lambda: not audit(db, margin=2.0).missing, 90, "every period due decided",
                 interval=0.5)
        result = assert_audit_clean(db, margin=2.0, context="after the crash during the burst")
        assert result.periods >= SCHEDULES * BACKLOG

        def unfinished() -> int:
            return db.execute("SELECT count(*) FROM outbox WHERE scheduled_for < %s"
                              " AND state <> 'succeeded'", (back,)).fetchone()[0]
        wait_for(lambda: unfinished() == 0, 90, "every job of the burst to succeed", interval=0.5)
        keys = [k for (k,) in db.execute("SELECT idempotency_key FROM outbox"
                                         " WHERE scheduled_for < %s", (back,))]
        assert len(keys) >= SCHEDULES * BACKLOG
        runs = Counter(line.split("\t")[0] for line in effects.read_text().splitlines())
        assert [k for k in keys if runs[k] == 0] == [], "a job never ran"
        assert [k for k, n in runs.items() if n > 1] == [], "a job ran twice"
        terms = db.execute("SELECT count(DISTINCT term) FROM periods").fetchone()[0]
        print(f"leader {leader.instance_id} term {leader.term}; {result.periods} periods over "
              f"{terms} terms, {len(keys)} jobs of the burst, each run once")
        assert terms >= 2  # the burst was finished by a term that began after the crash
        assert db.execute("SELECT count(*) FROM periods WHERE term = %s AND scheduled_for < %s",
                          (leader.term, back - timedelta(seconds=60))).fetchone()[0] > 0
    finally:
        db.close()
        for d in daemons:
            d.kill()
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert "Traceback" not in err and "Exception in thread" not in err, err[-3000:]
    for d in daemons:
        assert "Traceback" not in d.log_text(), d.log_text()[-3000:]
