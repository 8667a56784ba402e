"""Runtime schedules with real daemons (SPEC §15; docs/runtime-schedules.md): a put is adopted
without a restart and fires from its commit on, never before; a change takes over from its
adoption and `history` judges each period by the version in force; a delete is fenced against a
leader writing every second; a failover loses and doubles nothing; the file set and the runtime
schedules share one namespace, refused both ways.

Real processes and a private PostgreSQL (tests/daemon_harness.py)."""

from __future__ import annotations

import json
import random
import subprocess
import time
from datetime import timedelta

import psycopg
import pytest
from daemon_harness import (
    CRONKEEPER,
    Daemon,
    assert_audit_clean,
    audit,
    db_now,
    leader_row,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    wait_new_leader,
    write_schedules,
)
from handlers_for_tests import spawn_worker

import cronkeeper
from cronkeeper import schedules
from cronkeeper.errors import ScheduleError

EVERY_SECOND = {"cron": "* * * * * *", "timezone": "UTC", "misfire": "skip", "task": "t.rt",
                "overlap": "allow", "owner": "tests"}


@pytest.fixture
def pg():
    return shared_postgres()


@pytest.fixture
def setup(pg, tmp_path):
    schema = pg.new_schema()
    files = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("file-tick", every="5s")})
    daemons: list[Daemon] = []

    def daemon(name: str, *extra: str) -> Daemon:
        d = Daemon(url=pg.url, schema=schema, cluster="rt", schedules=files, instance_id=name,
                   log_dir=tmp_path, extra=extra)
        daemons.append(d)
        return d.start()

    conn = set_path(pg.connect(), schema)
    yield schema, files, daemon, conn
    for d in daemons:
        if d.alive():
            d.kill()
    conn.close()


def app(pg) -> psycopg.Connection:
    """An application's connection: not autocommit, no search_path."""
    return psycopg.connect(pg.url)


def put_now(pg, schema: str, name: str, spec: dict) -> tuple[int, object]:
    """Put in a transaction of its own; return (version id, an instant just before its commit)."""
    with app(pg) as conn:
        version = schedules.put(conn, name, spec, schema=schema)
        before = db_now(conn)
        conn.commit()
    return version, before


def jobs(conn: psycopg.Connection, name: str) -> list:
    return [r[0] for r in conn.execute(
        "SELECT scheduled_for FROM outbox WHERE schedule = %s ORDER BY 1", (name,))]


def history(pg, schema: str, name: str) -> dict:
    out = subprocess.run([CRONKEEPER, "history", name, "--since", "10m", "--format", "json",
                          "--database-url", pg.url, "--schema", schema],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def test_put_change_and_delete_without_restart(pg, setup):
    schema, _files, daemon, conn = setup
    leader = daemon("n1")
    wait_for(lambda: leader_row(conn, "rt"), 30, "a leader")
    first, before = put_now(pg, schema, "tenant-1.tick", EVERY_SECOND)
    wait_for(lambda: len(jobs(conn, "tenant-1.tick")) >= 3, 20, "the runtime schedule to fire")
    assert min(jobs(conn, "tenant-1.tick")) > before, "fired for a period before its commit"
    adopted = leader.wait_log(lambda r: r.get("action") == "schedule_new"
                              and r.get("schedule") == "tenant-1.tick", 5, "adoption logged")
    assert adopted["source"] == "runtime"

    # a change: every 2 s from its adoption on, judged by the version in force
    changed, before_change = put_now(pg, schema, "tenant-1.tick", {**EVERY_SECOND, "cron": "*/2 * * * * *"})
    assert changed > first
    wait_for(lambda: conn.execute("SELECT count(*) FROM schedule_versions WHERE id = %s",
                                  (changed,)).fetchone()[0], 10, "the change adopted")
    active_from = conn.execute("SELECT active_from FROM schedule_versions WHERE id = %s",
                               (changed,)).fetchone()[0]
    assert active_from > before_change
    wait_for(lambda: conn.execute("SELECT count(*) FROM periods WHERE version_id = %s",
                                  (changed,)).fetchone()[0] >= 3, 20, "periods of the new version")
    rows = conn.execute("SELECT scheduled_for, version_id FROM periods WHERE schedule = %s",
                        ("tenant-1.tick",)).fetchall()
    assert all(v == changed for at, v in rows if at > active_from)
    assert all(at.second % 2 == 0 for at, v in rows if v == changed)
    assert all(v == first for at, v in rows if at <= active_from)
    doc = history(pg, schema, "tenant-1.tick")
    summary = doc["summary"][0]
    assert summary["missing"] == 0 and summary["emitted"] == len(rows) - summary["skipped"], doc

    # a delete: nothing after its commit, the leader still running
    with app(pg) as c:
        assert schedules.delete(c, "tenant-1.tick", schema=schema)
        c.commit()
        after_delete = db_now(c)
    leader.wait_log(lambda r: r.get("action") == "schedule_removed"
                    and r.get("schedule") == "tenant-1.tick", 10, "the delete adopted")
    time.sleep(2.5)  # let seconds pass that the deleted schedule would have fired at
    assert max(jobs(conn, "tenant-1.tick")) <= after_delete
    assert leader.alive()
    assert_audit_clean(conn, context=leader.log_text()[-3000:])


def test_deletes_race_a_leader_writing_every_second(pg, setup):
    """Deletes committed at every phase of the second, each at most a few milliseconds from a
    period the leader is writing: no period later than a delete's commit is ever emitted."""
    schema, _files, daemon, conn = setup
    daemon("n1")
    wait_for(lambda: leader_row(conn, "rt"), 30, "a leader")
    rng = random.Random(22)
    violations = []
    for i in range(12):
        name = f"race-{i}"
        put_now(pg, schema, name, EVERY_SECOND)
        wait_for(lambda name=name: jobs(conn, name), 20, f"{name} fires")
        now = db_now(conn)
        # commit the delete at a random phase of a coming second (many near its start)
        target = now.replace(microsecond=0) + timedelta(seconds=1,
                                                         microseconds=rng.choice([0, 1000, 3000, rng.randrange(1_000_000)]))
        with app(pg) as c:
            assert schedules.delete(c, name, schema=schema)
            wait = (target - db_now(c)).total_seconds()
            if wait > 0:
                time.sleep(wait)
            c.commit()
            committed_by = db_now(c)
        violations += [(name, at, committed_by) for at in jobs(conn, name) if at > committed_by]
    time.sleep(2)
    for i in range(12):
        name = f"race-{i}"
        last = conn.execute("SELECT max(deleted_at) FROM runtime_schedules WHERE name = %s",
                            (name,)).fetchone()[0]
        assert last is not None
    assert violations == []
    assert_audit_clean(conn)


def test_failover_with_runtime_schedules_no_duplicate_no_gap(pg, setup):
    schema, _files, daemon, conn = setup
    a = daemon("n1")
    wait_for(lambda: leader_row(conn, "rt"), 30, "a leader")
    b = daemon("n2")
    with app(pg) as c:
        schedules.put_many(c, {f"f-{i}": EVERY_SECOND for i in range(20)}, schema=schema)
        c.commit()
    wait_for(lambda: all(jobs(conn, f"f-{i}") for i in range(20)), 20, "all of them fire")
    first = leader_row(conn, "rt")
    leading = a if first.instance_id == "n1" else b
    leading.kill()
    new = wait_new_leader(conn, "rt", first.term, 20)
    # a put while the new leader leads: adopted by it
    put_now(pg, schema, "after-failover", EVERY_SECOND)
    wait_for(lambda: jobs(conn, "after-failover"), 20, "the new leader adopts a put")
    wait_for(lambda: not audit(conn, margin=2.0).missing, 20, "every due period decided")
    result = assert_audit_clean(conn)
    assert result.duplicate_jobs == []
    assert new.instance_id != first.instance_id
    # the versions the new leader read back were not recorded again
    assert conn.execute("SELECT count(*) FROM schedule_versions WHERE schedule = 'f-0'").fetchone()[0] == 1


def test_one_namespace_both_ways(pg, setup, tmp_path):
    schema, files, daemon, conn = setup
    leader = daemon("n1")
    wait_for(lambda: leader_row(conn, "rt"), 30, "a leader")
    put_now(pg, schema, "clash", EVERY_SECOND)
    wait_for(lambda: jobs(conn, "clash"), 20, "the runtime schedule fires")
    # a reload whose files define the runtime schedule's name: refused, the last set runs on
    write_schedules(files, {"a.toml": schedule_toml("file-tick", every="5s"),
                            "b.toml": schedule_toml("clash", every="2s")})
    leader.signal(1)  # SIGHUP
    refused = leader.wait_log(lambda r: r.get("action") == "reload_refused"
                              and "held by a runtime schedule" in r.get("message", ""), 10,
                              "the reload refused")
    assert "clash" in refused["message"]
    # a daemon started on that set exits 1 naming the runtime schedule
    out = subprocess.run([CRONKEEPER, "run", "--database-url", pg.url, "--schema", schema,
                          "--cluster", "rt2", "--schedules", str(files),
                          "--metrics-address", "off"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1
    assert "schedule 'clash': the name is held by a runtime schedule" in out.stderr
    # and a put of a file schedule's name is refused, naming its file
    with app(pg) as c, pytest.raises(ScheduleError) as err:
        schedules.put(c, "file-tick", EVERY_SECOND, schema=schema)
    assert str(files / "a.toml") in str(err.value)
    assert leader.alive()


def test_sync_rollback_and_bad_specs_with_a_running_leader(pg, setup):
    schema, _files, daemon, conn = setup
    leader = daemon("n1")
    wait_for(lambda: leader_row(conn, "rt"), 30, "a leader")
    with app(pg) as c:
        schedules.put_many(c, {"t1.a": EVERY_SECOND, "t1.b": EVERY_SECOND}, schema=schema)
        c.commit()
        schedules.put(c, "never", EVERY_SECOND, schema=schema)
        c.rollback()  # a rolled-back put: nothing, ever
        with pytest.raises(ScheduleError):  # a bad spec beside a good one: neither written
            schedules.put_many(c, {"also-never": EVERY_SECOND,
                                   "bad": {**EVERY_SECOND, "misfire": "whenever"}},
                               schema=schema)
        c.rollback()
    wait_for(lambda: jobs(conn, "t1.a") and jobs(conn, "t1.b"), 20, "both fire")
    with app(pg) as c:
        schedules.sync(c, {"t1.b": {**EVERY_SECOND, "cron": "*/2 * * * * *"},
                           "t1.c": EVERY_SECOND}, prefix="t1.", schema=schema)
        c.commit()
        synced = db_now(c)
    wait_for(lambda: jobs(conn, "t1.c"), 20, "the synced new one fires")
    leader.wait_log(lambda r: r.get("action") == "schedule_removed"
                    and r.get("schedule") == "t1.a", 10, "t1.a removed by the sync")
    time.sleep(2)
    assert [at for at in jobs(conn, "t1.a") if at > synced] == []
    versions = conn.execute("SELECT count(*) FROM schedule_versions WHERE schedule = 't1.b'"
                            ).fetchone()[0]
    assert versions == 2
    for name in ("never", "also-never", "bad"):
        assert conn.execute("SELECT count(*) FROM schedule_versions WHERE schedule = %s",
                            (name,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM runtime_schedules WHERE name = %s",
                            (name,)).fetchone()[0] == 0
        assert jobs(conn, name) == []
    assert_audit_clean(conn)


def test_a_runtime_schedule_names_a_calendar_the_files_define(pg, setup):
    """Issue 25 item 4: the leader records the files' calendars; a put names one, and its
    periods on the listed dates are skipped (reason calendar), never missing."""
    schema, files, daemon, conn = setup
    today = db_now(conn).date()
    days = [str(today - timedelta(days=1)), str(today), str(today + timedelta(days=1))]
    write_schedules(files, {"a.toml": schedule_toml("file-tick", every="5s"),
                            "cal.toml": f"[calendars.closed]\ndates = {json.dumps(days)}\n"})
    daemon("n1")
    wait_for(lambda: conn.execute("SELECT count(*) FROM calendars WHERE name = 'closed'"
                                  ).fetchone()[0], 30, "the leader records the calendar")
    put_now(pg, schema, "closed-days", {**EVERY_SECOND, "calendar": "closed"})
    wait_for(lambda: conn.execute("SELECT count(*) FROM periods WHERE schedule = 'closed-days'"
                                  ).fetchone()[0] >= 3, 20, "its periods decided")
    outcomes = conn.execute("SELECT DISTINCT outcome, reason FROM periods "
                            "WHERE schedule = 'closed-days'").fetchall()
    assert outcomes == [("skipped", "calendar")]
    assert jobs(conn, "closed-days") == []
    assert_audit_clean(conn)


def test_workers_keep_the_output_limit_of_schedules_they_have_no_file_of(pg, setup, tmp_path):
    """SPEC §16 with §15: a runtime schedule's ``output_limit`` is the one its jobs keep, as is
    a file schedule's on a worker without that file (the leader's, here): the worker reads it
    from the version the job names. ``--output-limit`` is for enqueued jobs only."""
    schema, _files, daemon, conn = setup
    logged = {**EVERY_SECOND, "task": "output.log_lines", "payload": {"lines": 100}}
    files = write_schedules(tmp_path / "leader", {"a.toml": (
        '[filed]\ncron = "* * * * * *"\ntimezone = "UTC"\nmisfire = "skip"\noverlap = "allow"\n'
        'task = "output.log_lines"\npayload = {lines = 100}\noutput_limit = "512B"\n')})
    leader = Daemon(url=pg.url, schema=schema, cluster="rt", schedules=files, instance_id="n1",
                    log_dir=tmp_path, extra=()).start()
    try:
        wait_for(lambda: leader_row(conn, "rt"), 30, "a leader")
        with app(pg) as c:
            schedules.put_many(c, {"tenant-small": {**logged, "output_limit": "1KiB"},
                                   "tenant-none": {**logged, "output_limit": "0B"},
                                   "tenant-default": logged}, schema=schema)
            c.commit()
        enqueued = cronkeeper.enqueue(conn, "output.log_lines", {"lines": 100}, key="enqueued",
                                      schema=schema)
        names = ("filed", "tenant-small", "tenant-none", "tenant-default")
        wait_for(lambda: all(jobs(conn, n) for n in names), 20, "a job of every schedule")
        worker = spawn_worker(pg.url, schema, "--import", "handlers_output",
                              "--output-limit", "2KiB", cluster="rt")
        try:
            def first_ended(name: str):
                rows = conn.execute(
                    "SELECT a.output FROM outbox o JOIN attempts a ON a.job_id = o.id WHERE "
                    "o.schedule IS NOT DISTINCT FROM %s AND (%s OR o.id = %s) AND "
                    "a.finished_at IS NOT NULL ORDER BY o.scheduled_for LIMIT 1",
                    (None if name == "enqueued" else name, name != "enqueued", enqueued)).fetchall()
                return rows[0] if rows else None

            ended = {}
            for name in (*names, "enqueued"):
                wait_for(lambda n=name: first_ended(n), 60, f"an attempt of {name} ended",
                         alive=worker)
                ended[name] = first_ended(name)[0]
        finally:
            worker.kill()
            worker.wait()
    finally:
        leader.kill()
    assert ended["tenant-none"] is None, "output kept against output_limit 0B"
    full = bytes(ended["tenant-default"])  # the default, 64 KiB, holds all 100 lines
    assert b"left out" not in full and full.count(b"\n") == 100
    for name, limit in (("filed", 512), ("tenant-small", 1024), ("enqueued", 2048)):
        text = bytes(ended[name])
        head, cut, rest = text.partition(b"\n[cronkeeper: ")
        assert cut, f"{name}: nothing left out of {len(text)} bytes"
        tail = rest.split(b" bytes left out]\n", 1)[1]
        assert len(head) + len(tail) == limit, (name, len(head), len(tail))
        assert text.endswith(b" line 99\n"), name
