"""PostgreSQL out of disk (issue 21 §3, SPEC §10): the private cluster's data directory, WAL
included, lives on a small tmpfs this test mounts (as root) and unmounts, even on failure. Two
daemons and a worker run every-second schedules (``misfire = "catch_up"``); the test then fills
the filesystem with a file of its own until ``ENOSPC`` and keeps it full for HOLD seconds, so
PostgreSQL refuses writes (``ERROR: could not extend file ...: No space left on device``) or,
when the WAL itself cannot grow, stops with a PANIC. Then it deletes the filler and, if the
server stopped, starts it again as docs/operations.md ("PostgreSQL out of disk") says.

What must hold: no cronkeeper process exits; each says what is wrong without a flood (a few
lines for the hold, not one per retry); after the heal periods are decided and jobs run within
seconds (printed, not asserted); nothing recorded before the fault is lost; every period of the
whole run is decided exactly once (the outage's own ones caught up); every job ends; and what
happened is visible: ``cronkeeper history`` over the window exits 0, and the logs say the
database refused writes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon_harness import (
    CRONKEEPER,
    Fleet,
    PrivatePostgres,
    audit,
    db_now,
    json_records,
    schedule_toml,
    set_path,
    spawn_json_worker,
    wait_for,
    write_schedules,
)
from faults import fill_disk, free_disk, server_running, small_tmpfs

SIZE = "96m"  # the cluster takes about 41 MB of it (16 MB of WAL)
HOLD = 18.0  # seconds the filesystem is kept full once PostgreSQL has refused a write
SCHEDULES = ("tick-a", "tick-b", "tick-c")  # three rows a second: the tables must grow soon
# The log lines that say the database is away or refuses, or that leadership went or came.
AWAY = {"db_unavailable", "database_unavailable", "listen_lost", "leader_lost", "leader_stalled",
        "internal_error"}
REFUSED = ("No space left on device", "could not extend file", "disk full")


def test_refused_writes_are_told_from_other_errors() -> None:
    from cronkeeper.db.engine import refuses_writes  # noqa: PLC0415
    from cronkeeper.errors import DatabaseError  # noqa: PLC0415

    assert refuses_writes(psycopg.errors.DiskFull("could not extend file"))
    assert refuses_writes(psycopg.errors.OutOfMemory("out of memory"))
    wrapped = DatabaseError("recording job endings: could not extend file")
    wrapped.__cause__ = psycopg.errors.DiskFull("could not extend file")
    assert refuses_writes(wrapped)
    assert not refuses_writes(psycopg.errors.TooManyConnections("too many clients already"))
    assert not refuses_writes(psycopg.OperationalError("server closed the connection"))
    assert not refuses_writes(DatabaseError("no cause"))


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A tmpfs of SIZE, mounted for this test and unmounted after it, whatever happened."""
    if os.geteuid() != 0:
        pytest.fail("this test mounts a small filesystem: it must run as root")
    with small_tmpfs(SIZE) as mount:
        yield mount


@pytest.fixture
def server(small_disk: Path) -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres(data_dir=small_disk / "data")
    try:
        yield pg.start()
    finally:
        pg.stop()


def query(pg: PrivatePostgres, schema: str, sql: str, params: Any = None) -> list[tuple]:
    """A query on a fresh session (the server may have restarted since the last one)."""
    with set_path(pg.connect(), schema) as conn:
        return conn.execute(sql, params).fetchall()


@pytest.mark.parametrize("full", ["data", "wal"])
def test_out_of_disk_is_survived_said_once_and_resumed_with_nothing_lost(
        server: PrivatePostgres, small_disk: Path, tmp_path: Path, full: str) -> None:
    """``data``: a table or index cannot grow (an ERROR; the server stays up). ``wal``: the
    test also asks for a WAL segment switch (``pg_switch_wal()``, what 16 MB of WAL brings on
    its own), so the next WAL write needs a new segment file and the server PANICs."""
    pg = server
    schema = pg.new_schema()
    schedules = write_schedules(tmp_path / "s", {"ticks.toml": "\n".join(
        schedule_toml(name, every="1s", misfire="catch_up", catch_up_limit="1h", task="noop")
        for name in SCHEDULES)})
    fleet = Fleet(pg, schema, schedules, tmp_path, n=2)
    worker_log = tmp_path / "worker.log"
    worker: subprocess.Popen | None = None
    fillers = 0

    def count(sql: str, params: Any = None) -> int:
        return query(pg, schema, sql, params)[0][0]

    try:
        fleet.start()
        worker = spawn_json_worker(pg.url, schema, fleet.cluster, "w1", worker_log,
                                   "--task", "noop")
        wait_for(lambda: count("SELECT count(*) FROM outbox WHERE state = 'succeeded'") >= 6, 40,
                 "jobs to run before the fault", interval=0.2)
        with set_path(pg.connect(), schema) as conn:
            started = conn.execute("SELECT min(scheduled_for) FROM periods").fetchone()[0]
            before_periods = set(conn.execute(
                "SELECT schedule, scheduled_for, outcome::text FROM periods").fetchall())
            before_done = set(conn.execute(
                "SELECT id, state::text FROM outbox WHERE state = 'succeeded'").fetchall())
            faulted = db_now(conn)
        marks = {d.instance_id: len(d.records()) for d in fleet.daemons}
        worker_mark = len(json_records(worker_log))
        server_log_mark = pg.logfile.stat().st_size

        fillers += 1
        print(f"\nfiller: {fill_disk(small_disk, fillers) >> 20} MB until ENOSPC")
        if full == "wal":
            with contextlib.suppress(psycopg.Error), pg.connect() as conn:
                conn.execute("SELECT pg_switch_wal()")

        def server_said(*needles: str) -> bool:
            with open(pg.logfile, "rb") as log:
                log.seek(server_log_mark)
                text = log.read().decode(errors="replace")
            return any(n in text for n in needles)

        def refused() -> bool:
            """PostgreSQL has refused a write (an ERROR) or stopped (a PANIC)."""
            fill_disk(small_disk, fillers)  # keep it full: a checkpoint may free a WAL segment
            return server_said("No space left on device")
        wait_for(refused, 60, "PostgreSQL to refuse a write for want of space", interval=0.2)
        refused_at = datetime.now().astimezone()

        def held() -> bool:
            fill_disk(small_disk, fillers)
            assert all(d.alive() for d in fleet.daemons), fleet.logs()
            assert worker.poll() is None, worker_log.read_text()[-3000:]
            return (datetime.now().astimezone() - refused_at).total_seconds() >= HOLD
        wait_for(held, HOLD + 15, "the hold", interval=0.5)
        panicked = server_said("PANIC")
        status = subprocess.run(
            [CRONKEEPER, "status", "--database-url", pg.url, "--schema", schema, "--cluster",
             fleet.cluster, "--format", "json"], capture_output=True, text=True, timeout=60)
        assert "Traceback" not in status.stdout + status.stderr, status.stderr
        if panicked:  # the server is down: said plainly
            assert status.returncode != 0 and status.stderr.strip(), status
        else:  # it answers: each schedule's next period is stuck in the past, overdue
            assert status.returncode == 0, status.stdout + status.stderr
            asked = datetime.now().astimezone()
            nexts = {r["name"]: r["next_fire"] for r in json.loads(status.stdout)["schedules"]}
            print("\nstatus in the fault, next fire:", nexts, "asked at", asked)
            stuck = asked - timedelta(seconds=HOLD / 2)
            assert all(datetime.fromisoformat(n) < stuck for n in nexts.values()), nexts

        lines = {d.instance_id: d.records()[marks[d.instance_id]:] for d in fleet.daemons}
        lines["w1"] = json_records(worker_log)[worker_mark:]
        for who, said in lines.items():
            about = [r for r in said if r.get("action") in AWAY | {"leader_won"}]
            print(f"\n{who}: {len(about)} lines in the fault:",
                  *(f"\n  {r['action']}: {r['message'][:200]}" for r in about))
            actions = Counter(r.get("action") for r in said)
            assert sum(actions[a] for a in AWAY) <= 5, (who, actions)
            if panicked:  # every session ended: the leader's term with it, once
                assert actions["leader_won"] + actions["leader_lost"] <= 2, (who, actions)
            else:  # no flapping: the leader keeps its lock, nobody else leads
                assert not actions.keys() & {"leader_won", "leader_lost", "leader_stalled",
                                             "leader_deposed"}, (who, actions)
        everything = [r.get("message", "") for said in lines.values() for r in said]
        if panicked:
            assert server_said("PANIC") and server_said("No space left on device")
            assert all(any(r.get("action") in AWAY for r in said) for said in lines.values())
        else:
            assert any(n in m for m in everything for n in REFUSED), (
                "no process said the database refused a write", lines)

        free_disk(small_disk)
        healed = datetime.now().astimezone()
        restarted = False
        if not server_running(pg):  # a PANIC that crash recovery could not get past
            pg.start()  # the runbook: free space, then start PostgreSQL (crash recovery)
            restarted = True
        with open(pg.logfile, "rb") as log:
            log.seek(server_log_mark)
            said = [line for line in log.read().decode(errors="replace").splitlines()
                    if any(w in line for w in ("PANIC", "FATAL", "aborting", "shut down",
                                               "terminated by signal"))]
        print("\nthe server said:", *(f"\n  {line[:160]}" for line in said[:8]))
        print(f"\nserver {'PANICked' if panicked else 'refused writes and stayed up'}; "
              f"{'started again by the test' if restarted else 'no restart needed'}")

        def decided_after_heal() -> datetime | None:
            return query(pg, schema, "SELECT min(decided_at) FROM periods WHERE decided_at > %s",
                         (healed,))[0][0]
        first = wait_for(decided_after_heal, 30, "a period decided after the heal", interval=0.1)
        wait_for(lambda: count("SELECT count(*) FROM outbox WHERE state = 'succeeded' AND "
                               "scheduled_for > %s", (healed,)) >= 2, 30,
                 "jobs of periods after the heal to run", interval=0.2)
        first_run = query(pg, schema, "SELECT min(finished_at) FROM attempts WHERE started_at > %s",
                          (healed,))[0][0]
        for d in fleet.daemons:  # each says it is back (the standby only if it noticed)
            if any(r.get("action") in AWAY for r in lines[d.instance_id]):
                d.wait_log(lambda r: r.get("action") == "db_reconnected", 20, "saying it is back")
        wait_for(lambda: any(r.get("action") == "database_reconnected"
                             for r in json_records(worker_log)[worker_mark:]), 20,
                 "the worker saying it is back")
        print(f"\nspace freed: a period decided {(first - healed).total_seconds():.1f} s later, "
              f"a job run {(first_run - healed).total_seconds():.1f} s later")

        with set_path(pg.connect(), schema) as db:
            wait_for(lambda: not audit(db, margin=1.5).missing, 40, "every due period decided",
                     interval=0.2)
            until = db_now(db) - timedelta(seconds=1.5)
            assert all(d.alive() for d in fleet.daemons), fleet.logs()
            assert worker.poll() is None, worker_log.read_text()[-3000:]
            outage = db.execute("SELECT count(*) FROM periods WHERE scheduled_for > %s AND "
                                "scheduled_for < %s", (faulted, healed)).fetchone()[0]
            assert outage >= len(SCHEDULES) * HOLD, outage
            for d in fleet.daemons:
                d.terminate()
            for d in fleet.daemons:
                assert d.stop(15) == 0, d.log_text()[-2000:]
            result = audit(db, until=until)
            assert not result.problems(), result.problems()
            assert result.periods >= len(SCHEDULES) * (until - started).total_seconds() - 3
            # nothing recorded before the fault is lost, nor changed
            after_periods = set(db.execute(
                "SELECT schedule, scheduled_for, outcome::text FROM periods").fetchall())
            assert before_periods <= after_periods, before_periods - after_periods
            after_done = set(db.execute("SELECT id, state::text FROM outbox").fetchall())
            assert before_done <= after_done, before_done - after_done
            wait_for(lambda: db.execute("SELECT count(*) FROM outbox WHERE state IN "
                                        "('available', 'running')").fetchone()[0] == 0, 60,
                     "every job to end", interval=0.2)
            states = db.execute("SELECT array_agg(DISTINCT state::text) FROM outbox").fetchone()[0]
            assert states == ["succeeded"], states

        result = subprocess.run(
            [CRONKEEPER, "history", *SCHEDULES, "--database-url", pg.url, "--schema", schema,
             "--cluster", fleet.cluster, "--since", started.isoformat(), "--until",
             until.isoformat(), "--format", "json"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        rows = json.loads(result.stdout)["periods"]
        in_outage = [r for r in rows
                     if faulted < datetime.fromisoformat(r["scheduled_for"]) < healed]
        print(f"\nhistory: {len(rows)} periods, {len(in_outage)} in the fault:",
              dict(Counter(r["status"] for r in in_outage)))
        assert len(in_outage) >= len(SCHEDULES) * HOLD, len(in_outage)
        assert {r["status"] for r in rows} == {"emitted"}, Counter(r["status"] for r in rows)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, worker_log.read_text()[-3000:]
        assert "Traceback" not in fleet.logs() + worker_log.read_text()
    finally:
        free_disk(small_disk)
        fleet.shutdown()
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait(10)
