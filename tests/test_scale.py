"""What lets one leader carry 100,000 schedules (issue 14), tested for results, never for speed:
triggers shared and table-free, work shared per trigger within a tick without mixing policies,
adoption in fenced batches, and bursts logged as one line."""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from claim_rows import Row, batch, flat
from daemon_harness import schedule_toml, set_path, shared_postgres, wait_for, write_schedules

from cronkeeper import clock, versions
from cronkeeper.db import leadership as dbl
from cronkeeper.db import periods_claims
from cronkeeper.db.engine import leader_lock_key, normalize_url
from cronkeeper.db.schedule_versions import versions_insert
from cronkeeper.leading import LeaderLoop
from cronkeeper.planning import Decision, Outcome, Reason
from cronkeeper.schedule import load_valid
from cronkeeper.schedule.model import ScheduleSet
from cronkeeper.scheduler import Scheduler, TickReport
from cronkeeper.term import Term
from cronkeeper.timing import TimingError, make_trigger
from cronkeeper.timing.triggers import CHUNK
from cronkeeper.versions import LOG_EACH_UP_TO


# -- triggers --------------------------------------------------------------------------------------
def test_schedules_with_one_cron_and_zone_share_one_trigger() -> None:
    a = make_trigger(cron="0,30 * * * * *", every=None, timezone="UTC")
    assert make_trigger(cron="0,30 * * * * *", every=None, timezone="UTC") is a
    assert make_trigger(cron="0,30 * * * * *", every=None, timezone="Europe/Berlin") is not a
    assert make_trigger(cron=None, every=30, timezone="UTC") is make_trigger(
        cron=None, every=30, timezone="UTC")
    for bad in (float("nan"), True, 0.5, [30]):  # the shared path still refuses what it should
        with pytest.raises(TimingError):
            make_trigger(cron=None, every=bad, timezone="UTC")  # type: ignore[arg-type]


def test_a_seconds_cron_fires_every_matching_second_in_bounded_chunks() -> None:
    trigger = make_trigger(cron="*/7 * * * * *", every=None, timezone="UTC")
    start = datetime(2026, 3, 1, 23, 0, 0, tzinfo=UTC)
    until = start + timedelta(days=2)
    expected = [start + timedelta(seconds=s) for s in range(1, 2 * 86400 + 1)
                if (start + timedelta(seconds=s)).second % 7 == 0]
    assert list(trigger.fires(start, until)) == expected
    lo = math.floor(start.timestamp())
    chunks = list(trigger.local_matches(lo, lo + 2 * 86400))
    assert max(len(c) for c in chunks) <= CHUNK
    assert [v for c in chunks for v in c] == [
        v for v in range(lo, lo + 2 * 86400) if v % 60 % 7 == 0]
    assert trigger.next_fire(start) == expected[0]


# -- the leader, in process ------------------------------------------------------------------------
def _lead(pg, schema: str, progress: Callable[[], None] = lambda: None) -> tuple:
    cluster = f"scale-{uuid.uuid4().hex[:6]}"
    conn = dbl.lock_connect(normalize_url(pg.url), schema, f"scale:{cluster}")
    key = leader_lock_key(schema, cluster)
    assert dbl.lock_wait(conn, key)
    term, _ = dbl.leadership_claim(conn, cluster, cluster)
    return conn, Scheduler(Term(conn, term, cluster, key, progress=progress))


def test_adoption_in_batches_records_every_version_at_one_instant_and_policies_stay_apart(
        tmp_path, monkeypatch):
    """20 schedules adopted 7 per transaction. Schedules that share a trigger share the tick's
    calendar work, but not their decisions: the overlap = "skip" ones whose job is unfinished
    are skipped while the "allow" ones fire."""
    pg = shared_postgres()
    schema = pg.new_schema()
    monkeypatch.setattr(versions, "ADOPT_ROWS", 7)
    files = {"a.toml": "\n".join(
        schedule_toml(f"s{i:02d}", every="1s", misfire="skip", grace="1h",
                      overlap="allow" if i % 2 else "skip") for i in range(20))}
    schedules = load_valid([str(write_schedules(tmp_path / "s", files))], now=clock.wall())
    conn, sched = _lead(pg, schema)
    db = set_path(pg.connect(), schema)
    try:
        sched.load_versions()
        sched.tick()
        assert set(sched.adopt(schedules).values()) == {"new"}
        recorded = db.execute("SELECT count(*), count(DISTINCT active_from), "
                              "count(DISTINCT xmin::text) FROM schedule_versions").fetchone()
        assert recorded == (20, 1, 3)  # every version, one instant, three transactions
        assert len({id(s.trigger) for s in sched.states.values()}) == 1

        def tick_until(n_jobs: int) -> None:
            wait_for(lambda: (sched.tick() and False) or db.execute(
                "SELECT count(*) FROM outbox").fetchone()[0] >= n_jobs, 20, f"{n_jobs} jobs")

        tick_until(20)  # the first second: one job each, nobody busy yet
        first = db.execute("SELECT max(scheduled_for) FROM periods").fetchone()[0]
        tick_until(30)  # a later second: only the 10 "allow" schedules emit
        rows = db.execute(
            "SELECT schedule, outcome, reason FROM periods WHERE scheduled_for > %s "
            "AND scheduled_for = (SELECT min(scheduled_for) FROM periods WHERE scheduled_for > %s)",
            (first, first)).fetchall()
        assert len(rows) == 20
        for schedule, outcome, reason in rows:
            allow = int(schedule[1:]) % 2 == 1
            assert (outcome, reason) == (("emitted", None) if allow else ("skipped", "overlap"))
        assert db.execute("SELECT count(*) FROM outbox GROUP BY schedule, scheduled_for "
                          "HAVING count(*) > 1").fetchall() == []

        # a new leader reads every version back and plans the same twenty schedules
        conn2, sched2 = _lead_after(pg, schema, conn)
        try:
            sched2.load_versions()
            assert sorted(sched2.states) == sorted(s.name for s in schedules.specs)
        finally:
            conn2.close()
    finally:
        db.close()
        if not conn.closed:
            conn.close()


def test_a_term_reads_back_and_adopts_in_steps_each_committed_and_reported_as_progress(
        tmp_path, monkeypatch):
    """Issue 21: the stall watchdog is fed per step, not per phase. Versions are adopted 7
    compared schedules at a time, each step's changes in a transaction of its own, and read
    back 3 at a time, each page in a transaction of its own; every step reports progress. A
    set changed between terms reads back whole and adopts only what changed."""
    pg = shared_postgres()
    schema = pg.new_schema()
    monkeypatch.setattr(versions, "ADOPT_ROWS", 7)
    monkeypatch.setattr(versions, "LOAD_ROWS", 3)
    names = [f"s{i:02d}" for i in range(20)]

    def schedules(crons: dict[str, str]) -> ScheduleSet:
        files = {"a.toml": "\n".join(schedule_toml(n, cron=c, misfire="skip")
                                      for n, c in crons.items())}
        return load_valid([str(write_schedules(tmp_path / "s", files))], now=clock.wall())

    first = schedules(dict.fromkeys(names, "0 4 * * *"))
    second = schedules({**dict.fromkeys(names[2:], "0 4 * * *"), "s05": "0 5 * * *"})
    db = set_path(pg.connect(), schema)
    steps: list[int] = []
    conn, sched = _lead(pg, schema, lambda: steps.append(1))
    try:
        sched.load_versions()
        assert len(steps) == 1  # one (empty) page
        sched.tick()
        assert set(sched.adopt(first).values()) == {"new"}
        # 20 compared in steps of 7, 7 and 6, each recorded; then two passes over the 20 new
        # states (building them, filing them by next fire), each reporting every 7
        assert len(steps) == 1 + 3 + 2 + 2
        assert db.execute("SELECT count(*), count(DISTINCT xmin::text) FROM "
                          "schedule_versions").fetchone() == (20, 3)

        conn, sched = _lead_after(pg, schema, conn, lambda: steps.append(1))  # the next term
        steps.clear()  # reads them back
        sched.load_versions()
        assert sorted(sched.states) == names
        assert len(steps) == 7 + 2  # pages of 3, 3, 3, 3, 3, 3 and 2; filing them by next fire
        sched.tick()
        assert sched.adopt(second) == {"s05": "changed", "s00": "removed", "s01": "removed"}
        assert sched.states["s05"].spec.cron == "0 5 * * *"

        conn, sched = _lead_after(pg, schema, conn)
        sched.load_versions()  # removals read back as absent, the change as in force
        assert sorted(sched.states) == names[2:]
        assert sched.states["s05"].spec.cron == "0 5 * * *"
        assert sched.adopt(second) == {}
    finally:
        db.close()
        if not conn.closed:
            conn.close()


def _lead_after(pg, schema: str, previous, progress: Callable[[], None] = lambda: None) -> tuple:
    previous.close()  # its lock goes with its session
    return _lead(pg, schema, progress)


# -- logging a burst -------------------------------------------------------------------------------
def _loop() -> LeaderLoop:
    return LeaderLoop(ScheduleSet(()))


TERM = Term(None, 1, "logs", 0)  # type: ignore[arg-type]  # _report writes nothing


def _report(n: int, skipped: int = 0) -> TickReport:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    report = TickReport(now=at)
    for i in range(n):
        decision = (Decision(at, Outcome.SKIPPED, Reason.OVERLAP) if i < skipped
                    else Decision(at, Outcome.EMITTED))
        report.decisions.append((f"s{i}", decision, None if i < skipped else i))
    return report


def test_a_few_decisions_log_a_line_each_and_a_burst_logs_one_summary(caplog) -> None:
    loop = _loop()
    caplog.set_level(logging.INFO, logger="cronkeeper")
    loop._report(_report(3, skipped=1), TERM)
    actions = [r.action for r in caplog.records]
    assert sorted(actions) == ["fire", "fire", "skip"]
    caplog.clear()
    loop._report(_report(LOG_EACH_UP_TO + 1, skipped=2), TERM)
    summary = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.action for r in summary] == ["fire_batch"]
    assert summary[0].getMessage() == (
        f"fired {LOG_EACH_UP_TO - 1} jobs, skipped 2 periods, 2 overlap in one tick")
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="cronkeeper")
    loop._report(_report(LOG_EACH_UP_TO + 1), TERM)
    assert sum(1 for r in caplog.records if getattr(r, "action", "") == "fire") == (
        LOG_EACH_UP_TO + 1)  # each period still at debug


@pytest.mark.parametrize("writer", ["statement", "copy"])
def test_a_grouped_claim_writes_each_periods_own_columns(writer: str, monkeypatch) -> None:
    """A claim sends what periods share (instant, decision, job columns) once per group and
    four values per period; every row written still carries its own schedule, version, key
    and run_after, and the shared columns of its own group. The same through the claim
    statement and through the tick's COPY, text that COPY must escape included; periods
    already decided are left out by both (the COPY falls back to the statement)."""
    pg = shared_postgres()
    conn = set_path(pg.connect(), pg.new_schema())
    odd = "s\\6\tN\n\\N"  # backslash, tab, newline, and COPY's NULL spelled out

    def claim(rows: list[Row], term: int) -> list[periods_claims.Claim]:
        if writer == "statement":  # the reference, alone
            return flat(periods_claims._periods_claim_statement(conn, [batch(rows)], term))
        half = len(rows) // 2  # two batches sharing their groups, as a tick's do
        first = batch(rows[:half])
        return flat(periods_claims.periods_claim(conn, [first, batch(rows[half:], first)], term,
                                                 lambda: beats.append(1)))

    beats: list[int] = []  # the stall watchdog's heartbeats from the COPY path

    try:
        at = datetime(2026, 1, 1, tzinfo=UTC)
        later = at + timedelta(seconds=30)
        ids = versions_insert(conn, [(f"s{i}", "d", "{}") for i in range(6)]
                                  + [(odd, "d", "{}")], at, 1)

        def row(name: str, when: datetime, outcome: str = "emitted", reason: str | None = None,
                task: str = "t.a", run_after: datetime | None = None) -> Row:
            if outcome != "emitted":
                return Row(name, when, ids[name], outcome, reason)
            return Row(name, when, ids[name], outcome, reason,
                                 f"{name}@{when:%Y-%m-%dT%H:%M:%SZ}", task, f'{{"n": "{name}"}}'
                                 if task == "t.b" else "{}", 3, run_after or when, 60.0,
                                 '{"base": 1}', task == "t.b", "o")

        rows = [row("s0", at), row("s1", at), row("s0", later),
                row("s2", at, task="t.b", run_after=at + timedelta(seconds=7)),
                row("s3", at, "skipped", "misfire"), row("s4", later, reason="backfill"),
                row("s5", later, "skipped", "overlap")]
        grouped = batch(rows)
        assert len(grouped.groups) == 6 and len(grouped) == 7
        rows.append(row(odd, at)._replace(
            task="t.\\c\td", owner="o\tp\\N", backoff_json='{"base": 2}',
            payload_json=json.dumps({"n": "a\tb\\c\nd \\N \u00e9\r"}, ensure_ascii=False),
            run_after=(at + timedelta(seconds=3, microseconds=123457)).astimezone(
                ZoneInfo("America/New_York"))))  # jitter: microseconds, and any zone
        if writer == "copy":  # these are new: the COPY writes them, never the statement
            def refuse(*_: object) -> None:
                raise AssertionError("the claim statement ran for periods nobody had decided")

            monkeypatch.setattr(periods_claims, "_periods_claim_statement", refuse)
        with conn.transaction():
            claimed = claim(rows, 1)
        monkeypatch.undo()
        assert writer == "statement" or len(beats) == 2  # a beat per batch of jobs
        assert sorted((c[0], c[1], c[2], c[3], c[4] is not None) for c in claimed) == sorted(
            (r.schedule, r.scheduled_for, r.outcome, r.reason, r.outcome == "emitted")
            for r in rows)
        periods = conn.execute("SELECT schedule, scheduled_for, version_id, outcome, reason, "
                               "term FROM periods").fetchall()
        assert sorted(periods) == sorted(
            (r.schedule, r.scheduled_for, r.version_id, r.outcome, r.reason, 1) for r in rows)
        jobs = conn.execute(
            "SELECT idempotency_key, schedule, scheduled_for, version_id, task, payload::text, "
            "max_attempts, run_after, timeout_seconds, backoff::text, serial, owner FROM outbox"
        ).fetchall()
        assert sorted(jobs) == sorted(
            (r.key, r.schedule, r.scheduled_for, r.version_id, r.task, r.payload_json,
             r.max_attempts, r.run_after, r.timeout, r.backoff_json, r.serial, r.owner)
            for r in rows if r.outcome == "emitted")
        with conn.transaction():  # claimed already: no row back, no job
            assert claim(rows, 2) == []
        assert writer == "statement" or len(beats) == 3  # and one before the fallback
        latest = at + timedelta(seconds=60)
        with conn.transaction():  # some claimed already: only the others come back
            again = claim([*rows[:3], row("s1", latest), row("s5", latest, "skipped", "misfire")],
                          2)
        assert sorted(c[:4] for c in again) == [("s1", latest, "emitted", None),
                                                ("s5", latest, "skipped", "misfire")]
        assert conn.execute("SELECT count(*), count(*) FILTER (WHERE term = 2) FROM periods"
                            ).fetchone() == (len(rows) + 2, 2)
        assert conn.execute("SELECT array_agg(id) FROM outbox WHERE scheduled_for = %s",
                            (latest,)).fetchone()[0] == [again[0][4] or again[1][4]]
    finally:
        conn.close()
