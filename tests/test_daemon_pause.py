"""Pause judged at each period's due instant (SPEC §4), with real daemons: a schedule paused
and resumed while no leader runs (an operator's maintenance window during an outage) has the
periods due inside the pause skipped (paused) by the catch-up, and the ones before and after
emitted, each once. Before, the catch-up judged every missed period by the pause state at
catch-up time (resumed) and emitted the window's jobs anyway."""

from __future__ import annotations

import subprocess
from datetime import timedelta

from daemon_harness import (
    CRONKEEPER,
    Fleet,
    db_now,
    leader_row,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    wait_new_leader,
    write_schedules,
)

SCHEDULES = {"pause.toml": schedule_toml("window", every="1s", misfire="catch_up",
                                         catch_up_limit="1h")}


def test_a_pause_during_an_outage_skips_its_periods_and_only_those(tmp_path):
    pg = shared_postgres()
    schema = pg.new_schema()
    schedules = write_schedules(tmp_path / "schedules", SCHEDULES)
    fleet = Fleet(pg, schema, schedules, tmp_path, n=1)
    db = set_path(pg.connect(), schema)

    def control(command: str) -> None:
        done = subprocess.run([CRONKEEPER, command, "window", "--database-url", pg.url,
                               "--schema", schema], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr

    def wait_seconds(seconds: float, what: str) -> None:
        start = db_now(db)
        wait_for(lambda: (db_now(db) - start).total_seconds() >= seconds, seconds + 5, what)

    try:
        fleet.start()
        wait_for(lambda: db.execute("SELECT count(*) FROM periods").fetchone()[0] >= 2, 20,
                 "the schedule to fire before the outage")
        for d in fleet.daemons:  # graceful: the lock is released, no leader runs
            d.terminate()
        for d in fleet.daemons:
            assert d.stop(15) == 0, d.log_text()[-2000:]
        (last_before,) = db.execute("SELECT max(scheduled_for) FROM periods").fetchone()
        wait_seconds(2.5, "periods due before the pause")
        control("pause")
        (paused_at,) = db.execute("SELECT changed_at FROM schedule_controls").fetchone()
        wait_seconds(4, "the pause")
        control("resume")
        (resumed_at,) = db.execute("SELECT changed_at FROM schedule_controls").fetchone()
        wait_seconds(2.5, "periods due after the resume")
        term_before = leader_row(db, fleet.cluster).term
        fleet.start()
        new = wait_new_leader(db, fleet.cluster, term_before, 20, "a leader after the outage")
        wait_for(lambda: db.execute("SELECT max(scheduled_for) FROM periods").fetchone()[0]
                 >= new.since, 20, "the catch-up")

        rows = db.execute("SELECT scheduled_for, outcome, reason FROM periods "
                          "WHERE scheduled_for > %s AND scheduled_for < %s ORDER BY 1",
                          (last_before, new.since)).fetchall()
        instants = [r[0] for r in rows]  # every period of the outage, decided once
        assert instants == [last_before + timedelta(seconds=i + 1) for i in range(len(rows))]
        assert len(rows) >= 8
        inside = [(o, r) for p, o, r in rows if paused_at <= p < resumed_at]
        outside = [(o, r) for p, o, r in rows if not paused_at <= p < resumed_at]
        assert len(inside) >= 3 and len(outside) >= 4, rows
        assert set(inside) == {("skipped", "paused")}, rows
        assert set(outside) == {("emitted", None)}, rows
        jobs = db.execute("SELECT count(*), count(DISTINCT scheduled_for) FROM outbox").fetchone()
        emitted = db.execute("SELECT count(*) FROM periods WHERE outcome = 'emitted'").fetchone()
        assert jobs[0] == jobs[1] == emitted[0]
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{fleet.logs()}") from None
    finally:
        fleet.shutdown()
        db.close()
        with pg.connect() as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
