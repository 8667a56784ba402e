"""Two leaders at once (SPEC §1: "one job per period, even with two leaders"). The advisory lock
is made useless on purpose; the per-period unique claim alone must keep every period to one
outcome and one job. Also: a leader whose term moved on writes nothing (the fence)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from claim_rows import Row, batch, flat
from daemon_harness import (
    assert_audit_clean,
    audit,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)

from cronkeeper import clock
from cronkeeper.db import leadership as dbl
from cronkeeper.db import periods_claims
from cronkeeper.db.engine import leader_lock_key, normalize_url
from cronkeeper.errors import LeadershipLost
from cronkeeper.planning import idempotency_key
from cronkeeper.schedule import load_valid
from cronkeeper.scheduler import Scheduler
from cronkeeper.term import Term


@pytest.fixture
def pg_schema():
    pg = shared_postgres()
    return pg, pg.new_schema()


def _version(conn: psycopg.Connection, schedule: str) -> int:
    return conn.execute(
        "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
        "VALUES (%s, 'd', '{}'::jsonb, clock_timestamp(), 1) RETURNING id", (schedule,)).fetchone()[0]


def _rows(schedule: str, version: int, start: datetime, n: int) -> list[Row]:
    rows = []
    for i in range(n):
        at = start + timedelta(seconds=i)
        emitted = i % 5 != 0  # a mix of emitted and skipped decisions
        key = idempotency_key(schedule, at)
        rows.append(Row(
            schedule=schedule, scheduled_for=at, version_id=version,
            outcome="emitted" if emitted else "skipped", reason=None if emitted else "overlap",
            key=key if emitted else None, task="t" if emitted else None,
            payload_json="{}" if emitted else None, max_attempts=5 if emitted else None,
            run_after=at if emitted else None, timeout=60.0 if emitted else None,
            backoff_json='{"base": 30, "factor": 2, "max": 3600}' if emitted else None,
            serial=False if emitted else None, owner="tests" if emitted else None))
    return rows


@pytest.mark.parametrize("writer", ["statement", "copy"])
def test_concurrent_periods_claim_from_two_connections_one_job_per_period(pg_schema, writer):
    """Through the claim statement, and through the leader's COPY (whose loser fails on the
    unique index, waits for nothing more and falls back to the statement)."""
    pg, schema = pg_schema
    conns = [set_path(pg.connect(), schema) for _ in range(2)]
    try:
        version = _version(conns[0], "twice")
        start = datetime(2026, 1, 1, tzinfo=UTC)
        for round_ in range(5):  # overlapping but not identical batches, claimed at once
            base = start + timedelta(hours=round_)
            batches = [_rows("twice", version, base, 400),
                       _rows("twice", version, base + timedelta(seconds=200), 400)]
            barrier = threading.Barrier(2)
            results: list[list] = [[], []]

            def claim(i: int, batches=batches, barrier=barrier, results=results) -> None:
                with conns[i].transaction():
                    barrier.wait(10)
                    if writer == "statement":  # the reference, alone
                        results[i] = flat(periods_claims._periods_claim_statement(
                            conns[i], [batch(batches[i])], term=10 + i))
                    else:
                        results[i] = flat(periods_claims.periods_claim(
                            conns[i], [batch(batches[i])], term=10 + i))

            threads = [threading.Thread(target=claim, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            won = [{(r[0], r[1]) for r in res} for res in results]
            assert not won[0] & won[1], "a period was claimed by both leaders"
            assert len(won[0] | won[1]) == 600
            for res in results:  # every claimed emitted period came back with its job
                assert all((r[4] is not None) == (r[2] == "emitted") for r in res)
        assert conns[0].execute(
            "SELECT schedule, scheduled_for FROM outbox GROUP BY 1, 2 HAVING count(*) > 1"
        ).fetchall() == []
        jobs_vs_periods = conns[0].execute(
            """SELECT count(*) FILTER (WHERE o.id IS NULL AND p.outcome = 'emitted'),
                      count(*) FILTER (WHERE o.id IS NOT NULL AND p.outcome <> 'emitted')
               FROM periods p LEFT JOIN outbox o USING (schedule, scheduled_for)""").fetchone()
        assert jobs_vs_periods == (0, 0)
        counts = conns[0].execute(
            "SELECT count(*), count(DISTINCT (schedule, scheduled_for)) FROM periods").fetchone()
        jobs = conns[0].execute("SELECT count(*) FROM outbox").fetchone()[0]
        assert counts == (3000, 3000)
        assert jobs == 3000 - 3000 // 5
    finally:
        for c in conns:
            c.close()


def _lead(pg, schema: str, cluster: str) -> tuple[psycopg.Connection, str, int, int]:
    """A lock session that holds its cluster's lock and has won a term."""
    conn = dbl.lock_connect(normalize_url(pg.url), schema, f"split-brain:{cluster}")
    key = leader_lock_key(schema, cluster)
    dbl.lock_wait(conn, key)
    term, _ = dbl.leadership_claim(conn, cluster, cluster)
    return conn, cluster, term, key


def _started(conn: psycopg.Connection, cluster: str, term: int, key: int,
             schedules) -> Scheduler:
    """A Scheduler for a won term, caught up and running ``schedules`` (what the leader's loop,
    leading.LeaderLoop, does when a term begins)."""
    sched = Scheduler(Term(conn, term, cluster, key))
    sched.load_versions()
    sched.tick()
    sched.adopt(schedules)
    return sched


def _one_schedule(tmp_path, name: str):
    files = write_schedules(tmp_path / "schedules", {"s.toml": schedule_toml(name, cron="* * * * * *")})
    return load_valid([str(files)], now=clock.wall())


def test_two_schedulers_that_both_believe_they_lead_never_double_a_period(pg_schema, tmp_path):
    """Two Scheduler objects, each with a lock and a term of its own (two cluster names over
    one schema: the lock keeps neither out), tick the same schedules concurrently."""
    pg, schema = pg_schema
    files = write_schedules(tmp_path / "schedules", {"s.toml": "\n".join([
        schedule_toml("sb-second", cron="* * * * * *"),
        schedule_toml("sb-every-2s", every="2s"),
        schedule_toml("sb-skip", every="1s", misfire="skip", grace="1s"),
    ])})
    schedules = load_valid([str(files)], now=clock.wall())
    leaders = [_lead(pg, schema, f"sb-{uuid.uuid4().hex[:6]}-{i}") for i in range(2)]
    stop = threading.Event()
    lost = [0, 0]
    errors: list[BaseException] = []

    def start(i: int) -> Scheduler:
        conn, cluster, term, key = leaders[i]
        for _ in range(2):
            try:
                return _started(conn, cluster, term, key, schedules)
            except LeadershipLost as exc:
                # both recorded their versions at the same microsecond (they start together):
                # the designed answer is to reload and agree, as a node does in a new term
                if "concurrent leader recorded" not in str(exc):
                    raise
        return _started(conn, cluster, term, key, schedules)

    def run(i: int) -> None:
        try:
            sched = start(i)
            while not stop.is_set():
                lost[i] += sched.tick().lost
                stop.wait(0.01)  # both tick far more often than anything falls due
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    db = set_path(pg.connect(), schema)
    try:
        for t in threads:
            t.start()
        wait_for(lambda: db.execute("SELECT count(*) FROM periods WHERE schedule = 'sb-second'")
                 .fetchone()[0] >= 4, 15, "both schedulers to decide periods")
        wait_for(lambda: sum(lost) > 0 or errors, 15, "a claim lost to the other leader")
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    try:
        assert errors == []
        assert sum(lost) > 0
        terms = db.execute("SELECT count(DISTINCT term) FROM periods").fetchone()[0]
        assert terms >= 1
        result = assert_audit_clean(db, margin=1.0, context="two leaders")
        print(f"\nsplit brain: {result.periods} periods, {result.jobs} jobs, "
              f"{sum(lost)} claims lost to the other leader")
    finally:
        db.close()
        for conn, *_ in leaders:
            conn.close()


def test_a_leader_whose_term_moved_on_writes_nothing(pg_schema, tmp_path):
    pg, schema = pg_schema
    schedules = _one_schedule(tmp_path, "fenced")
    cluster = f"fence-{uuid.uuid4().hex[:6]}"
    conn, _, term, key = _lead(pg, schema, cluster)
    db = set_path(pg.connect(), schema)
    try:
        sched = _started(conn, cluster, term, key, schedules)
        wait_for(lambda: sched.tick().decisions, 5, "the first fire")
        # another instance wins a newer term (as after a deposal): the old one must not write
        db.execute("UPDATE leadership SET term = term + 1 WHERE cluster = %s", (cluster,))
        before = db.execute("SELECT count(*) FROM periods").fetchone()[0]

        def tick_raises() -> bool:
            try:
                sched.tick()
            except LeadershipLost:
                return True
            return False
        wait_for(tick_raises, 5, "the fenced leader's tick to refuse")
        assert db.execute("SELECT count(*) FROM periods").fetchone()[0] == before
        # and one that lost its lock (same term) is fenced too
        db.execute("UPDATE leadership SET term = %s WHERE cluster = %s", (term, cluster))
        dbl.lock_release(conn, key)
        wait_for(tick_raises, 5, "the lockless leader's tick to refuse")
        assert db.execute("SELECT count(*) FROM periods").fetchone()[0] == before
    finally:
        db.close()
        conn.close()


def test_audit_sees_a_missing_period_and_a_second_job(pg_schema, tmp_path):
    """The checker the daemon tests rely on is not vacuous."""
    pg, schema = pg_schema
    schedules = _one_schedule(tmp_path, "audited")
    cluster = f"audit-{uuid.uuid4().hex[:6]}"
    conn, _, term, key = _lead(pg, schema, cluster)
    db = set_path(pg.connect(), schema)
    try:
        sched = _started(conn, cluster, term, key, schedules)
        wait_for(lambda: sched.tick() and db.execute(
            "SELECT count(*) FROM periods").fetchone()[0] >= 3, 10, "three fires")
        assert_audit_clean(db, margin=0.5)
        victim = db.execute("SELECT scheduled_for FROM periods ORDER BY 1 LIMIT 1").fetchone()[0]
        db.execute("DELETE FROM outbox WHERE scheduled_for = %s", (victim,))
        db.execute("DELETE FROM periods WHERE scheduled_for = %s", (victim,))
        db.execute("INSERT INTO outbox (idempotency_key, schedule, scheduled_for, task) "
                   "SELECT 'dup-' || id, schedule, scheduled_for, task FROM outbox LIMIT 1")
        found = audit(db, margin=0.5)
        assert ("audited", victim) in found.missing
        assert len(found.duplicate_jobs) == 1 and len(found.bad_keys) == 1
    finally:
        db.close()
        conn.close()
