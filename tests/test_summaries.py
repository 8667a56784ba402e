"""The leader's summary (schedule_summaries, cronkeeper/summarizer.py) and the readers that use
it: status agrees with the live computation on the same data, falls back to it per schedule
(stale row, replaced version, a next fire past the row's list) and wholly without a leader; a
missing period shows in status and is told exactly once; each step feeds the watchdog."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import psycopg
import pytest
import sqlalchemy as sa
from conftest import libpq_url
from prometheus_client import CollectorRegistry

from cronkeeper import metrics as m
from cronkeeper import summarizer
from cronkeeper.db.schedule_summaries import summaries_read
from cronkeeper.operations.status import gather
from cronkeeper.schedule.model import Misfire, ScheduleSpec
from cronkeeper.summary import STALE_AFTER, next_fire_after

TERM = 7


def spec(name, *, every=None, cron=None, timeout=600.0, grace=300.0, zone="UTC"):
    return ScheduleSpec(name=name, every=every, cron=cron, timezone=zone,
                        misfire=Misfire.SKIP, task="t.x", owner="team-a", timeout=timeout,
                        grace=grace)


def version(conn, s, active_from):
    return conn.execute(sa.text(
        "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
        "(:n, :d, CAST(:j AS jsonb), :a, 1) RETURNING id"),
        {"n": s.name, "d": s.digest, "j": json.dumps(s.to_json()), "a": active_from}).scalar_one()


def period(conn, name, at, vid, *, seconds=None, outcome="succeeded", timeout=600.0):
    """A decided period, with a job and a finished attempt of ``seconds`` when given."""
    conn.execute(sa.text(
        "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, term) "
        "VALUES (:s, :t, :v, 'emitted', 1)"), {"s": name, "t": at, "v": vid})
    if seconds is None:
        return
    job = conn.execute(sa.text(
        "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, state, "
        "attempts, timeout_seconds, created_at, finished_at) VALUES (:k, :s, :t, :v, 't.x', "
        "'succeeded', 1, :to, :t, :t) RETURNING id"),
        {"k": f"{name}@{at.isoformat()}", "s": name, "t": at, "v": vid, "to": timeout}
    ).scalar_one()
    conn.execute(sa.text(
        "INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at, outcome) "
        "VALUES (:j, 1, 'w', :t, :t + make_interval(secs => :d), :o)"),
        {"j": job, "t": at, "d": seconds, "o": outcome})


class _Term:
    """What the summarizer uses of a term: its connection, confirm (the database's now),
    progress (counted: the watchdog's feed), number."""

    def __init__(self, conn) -> None:
        self.conn, self.number, self.steps = conn, TERM, 0

    def confirm(self):
        return self.conn.execute("SELECT clock_timestamp()").fetchone()[0]

    def progress(self) -> None:
        self.steps += 1


def lead(engine, cluster, *, released=False):
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM leadership WHERE cluster = :c"), {"c": cluster})
        conn.execute(sa.text(
            "INSERT INTO leadership (cluster, term, instance_id, backend_pid, since, heartbeat_at,"
            " released_at) VALUES (:c, :t, 'a', 1, now(), clock_timestamp(), "
            "CASE WHEN :r THEN clock_timestamp() END)"), {"c": cluster, "t": TERM, "r": released})


@pytest.fixture
def seeded(engine, cluster):
    """Four schedules, every instant away from the boundaries a second could cross: 'gappy'
    (minutely, periods 10-14 of the last 30 minutes never decided, grace 5 minutes), 'slow'
    (runs 500 s of a 600 s timeout) and 'flaky' (an attempt timed out), both yearly now, and
    'leap' (a cron in Berlin, on 29 February); and 'gone', every 10 minutes until it was removed
    ten minutes ago (its periods of the hour are missing: status audits it live)."""
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        start = (now - timedelta(minutes=30)).replace(second=0, microsecond=0)
        gappy = version(conn, spec("gappy", every=60), start)
        for n in range(1, 31):
            at = start + timedelta(minutes=n)
            if at <= now and not 10 <= n <= 14:
                period(conn, "gappy", at, gappy, seconds=0.5 + n / 10)
        slow = version(conn, spec("slow", cron="0 0 1 1 *"), now - timedelta(days=3))
        flaky = version(conn, spec("flaky", cron="0 0 1 1 *", timeout=60),
                        now - timedelta(days=3))
        for h in range(2, 40, 2):
            at = (now - timedelta(hours=h)).replace(minute=0, second=0, microsecond=0)
            period(conn, "slow", at, slow, seconds=500 + h)
            period(conn, "flaky", at + timedelta(minutes=7), flaky, seconds=60 if h == 4 else 3,
                   outcome="timeout" if h == 4 else "succeeded", timeout=60)
        conn.execute(sa.text(  # a job of 'gappy' ready for ten minutes: the queue is behind
            "INSERT INTO outbox (idempotency_key, schedule, task, state, run_after, owner) "
            "VALUES ('gappy-late', 'gappy', 't.x', 'available', now() - interval '10 minutes', "
            "'team-a')"))
        version(conn, spec("leap", cron="30 4 29 2 *", zone="Europe/Berlin"),
                now - timedelta(days=3))
        gone = version(conn, spec("gone", every=600), now - timedelta(days=2))
        conn.execute(sa.text(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('gone', 'removed', NULL, :a, 1)"), {"a": now - timedelta(minutes=10)})
        assert gone
    return ["flaky", "gappy", "leap", "slow"]


def summarize(database_url, schema, names, *, notify=False, passes=1):
    with psycopg.connect(libpq_url(database_url), options=f"-c search_path={schema}",
                         autocommit=True) as conn:
        term = _Term(conn)
        s = summarizer.Summarizer(notify=notify)
        for _ in range(passes):
            s._next = 0.0  # the next pass is due (not waited for)
            while s.step(term, names) and s._queue:
                pass
        return term


def comparable(doc):
    """The document without what differs between two reads of the same data (the time, the
    leader's heartbeat age, how long the ready job has waited) and the figures' source."""
    out = {k: v for k, v in doc.items() if k not in ("now", "figures", "last_leader")}
    out["queue"] = {**doc["queue"], "oldest_available": [
        {**o, "age_seconds": None} for o in doc["queue"]["oldest_available"]]}
    out["diagnosis"] = [re.sub(r"waited \d+s", "waited Ns", d) for d in doc["diagnosis"]]
    return out


def test_status_from_the_summary_agrees_with_the_live_computation(
        engine, database_url, schema, cluster, seeded):
    lead(engine, cluster)
    summarize(database_url, schema, seeded)
    summary = gather(engine, schema, cluster)
    live = gather(engine, schema, cluster, use_summary=False)
    assert summary["figures"]["summarized"] == 4 and summary["figures"]["computed_live"] == 0
    assert live["figures"]["summarized"] == 0 and live["figures"]["computed_live"] == 4
    assert 0 <= summary["figures"]["oldest_age_seconds"] < 60
    assert comparable(summary) == comparable(live)
    # and the figures are the ones the data implies, not merely equal
    assert summary["periods_missing_last_hour"]["gappy"] == 5
    assert summary["periods_missing_last_hour"]["gone"] >= 4  # removed: audited live
    by = {s["name"]: s for s in summary["schedules"]}
    assert by["flaky"]["attempts_timed_out_24h"] == 1 and by["flaky"]["near_timeout"]
    assert by["slow"]["near_timeout"] and not by["gappy"]["near_timeout"]
    assert by["leap"]["next_fire"].endswith("-02-29T03:30:00Z")
    assert sum(d.startswith("periods missing: 5 period(s) of gappy") for d in summary["diagnosis"]) == 1
    # the period around now, from the row's list of fires: the queue is behind by ten of them
    assert any(d.startswith("queue behind: the oldest ready job of gappy") and "(60s)" in d
               for d in summary["diagnosis"])


def test_status_reads_the_summary_while_a_leader_leads_and_not_without_one(
        engine, database_url, schema, cluster, seeded):
    """A row's figures are what status shows (a tampered p99 proves it), only while a leader
    leads: released, every schedule is computed live again."""
    lead(engine, cluster)
    summarize(database_url, schema, seeded)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE schedule_summaries SET duration_p99_seconds = 12345 "
                             "WHERE schedule = 'gappy'"))
    by = {s["name"]: s for s in gather(engine, schema, cluster)["schedules"]}
    assert by["gappy"]["duration_p99_seconds"] == 12345
    lead(engine, cluster, released=True)
    doc = gather(engine, schema, cluster)
    assert doc["figures"]["summarized"] == 0
    assert {s["name"]: s for s in doc["schedules"]}["gappy"]["duration_p99_seconds"] < 10


def test_a_stale_row_or_a_replaced_version_is_computed_live(
        engine, database_url, schema, cluster, seeded):
    lead(engine, cluster)
    summarize(database_url, schema, seeded)
    with engine.begin() as conn:
        conn.execute(sa.text(
            "UPDATE schedule_summaries SET computed_at = now() - make_interval(secs => :s), "
            "duration_p99_seconds = 12345 WHERE schedule = 'slow'"),
            {"s": STALE_AFTER + 1})
        conn.execute(sa.text("UPDATE schedule_summaries SET duration_p99_seconds = 12345 "
                             "WHERE schedule = 'leap'"))
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        version(conn, spec("leap", cron="45 5 * * *", timeout=30), now - timedelta(seconds=1))
    doc = gather(engine, schema, cluster)
    assert doc["figures"]["summarized"] == 2 and doc["figures"]["computed_live"] == 2
    by = {s["name"]: s for s in doc["schedules"]}
    assert by["slow"]["duration_p99_seconds"] < 600
    assert by["leap"]["timeout_seconds"] == 30 and by["leap"]["next_fire"].endswith(":45:00Z")
    assert comparable(doc) == comparable(gather(engine, schema, cluster, use_summary=False))


def test_a_period_decided_since_the_row_moves_its_next_fire_on(
        engine, database_url, schema, cluster, seeded):
    """Periods decided after the row was written: the next fire comes from the row's list while
    it reaches, and is computed past it; both as the live computation says."""
    lead(engine, cluster)
    summarize(database_url, schema, seeded)
    with engine.connect() as conn:
        row = summaries_read(conn)["gappy"]
    assert len(row.next_fires) > 2
    with engine.begin() as conn:
        vid = conn.execute(sa.text("SELECT max(id) FROM schedule_versions WHERE schedule = "
                                   "'gappy'")).scalar_one()
        period(conn, "gappy", row.next_fires[0], vid)
    assert next_fire_after(row, row.next_fires[0]) == (True, row.next_fires[1])
    doc = gather(engine, schema, cluster)
    assert doc["figures"]["summarized"] == 4
    assert comparable(doc) == comparable(gather(engine, schema, cluster, use_summary=False))
    with engine.begin() as conn:
        period(conn, "gappy", row.next_fires[-1], vid)
    assert next_fire_after(row, row.next_fires[-1]) == (False, None)
    doc = gather(engine, schema, cluster)
    nxt = {s["name"]: s for s in doc["schedules"]}["gappy"]["next_fire"]
    assert nxt == (row.next_fires[-1] + timedelta(minutes=1)).isoformat().replace("+00:00", "Z")
    assert comparable(doc) == comparable(gather(engine, schema, cluster, use_summary=False))


def test_a_missing_period_shows_in_status_and_is_told_exactly_once(
        engine, database_url, schema, cluster, seeded, caplog):
    """The summarizer's one audit: status (from the summary) counts the five missing periods,
    the metrics too, two passes log each once, and two passes and a new term tell them in one
    notification."""
    lead(engine, cluster)
    with caplog.at_level("WARNING", logger="cronkeeper.summarizer"):
        summarize(database_url, schema, seeded, notify=True, passes=2)
    logged = [r.scheduled_for for r in caplog.records
              if getattr(r, "action", None) == "period_missing" and r.schedule == "gappy"]
    assert len(logged) == len(set(logged)) == 5
    summarize(database_url, schema, seeded, notify=True)  # a new term: 24 hours back again
    doc = gather(engine, schema, cluster)
    assert doc["figures"]["summarized"] == 4
    assert doc["periods_missing_last_hour"]["gappy"] == 5
    with engine.connect() as conn:
        told = conn.execute(sa.text(
            "SELECT schedule, count FROM notifications WHERE event = 'missing'")).fetchall()
    assert told == [("gappy", 5)]
    reg = CollectorRegistry()
    reg.register(m.DatabaseCollector(engine, cluster))
    missing = {s.labels["schedule"]: s.value for f in reg.collect() for s in f.samples
               if f.name == "cronkeeper_periods_missing"}
    assert missing == {"gappy": 5, "slow": 0, "flaky": 0, "leap": 0}  # no audit of its own
    ages = [s.value for f in reg.collect() for s in f.samples
            if f.name == "cronkeeper_schedule_summary_age_seconds"]
    assert len(ages) == 1 and 0 <= ages[0] < 60


def test_each_step_is_one_transaction_that_feeds_the_watchdog(
        engine, database_url, schema, cluster, monkeypatch, seeded):
    """Steps of CHUNK schedules, each committed alone and reported as progress: a pass over
    many schedules never goes quiet for the stall watchdog. A removed schedule's row is not
    deleted (the scheduler's role has no DELETE) and never read."""
    monkeypatch.setattr(summarizer, "CHUNK", 1)
    term = summarize(database_url, schema, seeded)
    assert term.steps == 4
    with engine.connect() as conn:
        assert sorted(summaries_read(conn)) == seeded
        # a removed schedule's row (written before it went) stays, and is never read
        conn.execute(sa.text(
            "INSERT INTO schedule_summaries SELECT 'gone', version_id, owner, timeout_seconds, "
            "grace_seconds, decided_through, next_fires, "
            "missing_last_hour, missing_first, duration_attempts, duration_p50_seconds, duration_p99_seconds, "
            "attempts_timed_out_24h, term, computed_at FROM schedule_summaries "
            "WHERE schedule = 'slow'"))
        conn.commit()
    lead(engine, cluster)
    doc = gather(engine, schema, cluster)
    assert [s["name"] for s in doc["schedules"]] == seeded
    assert doc["figures"]["summarized"] == 4


def test_status_uses_the_summary_an_unreadable_version_costs_its_schedule_only(
        engine, database_url, schema, cluster, seeded):
    """A stored version status cannot read: that schedule is left out with the reason, every
    other schedule is still shown (live and from the summary alike)."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('odd', 'd', '{\"every\": \"soon\"}', now() - interval '10 minutes', 1)"))
    lead(engine, cluster)
    summarize(database_url, schema, seeded + ["odd"])
    for use in (True, False):
        doc = gather(engine, schema, cluster, use_summary=use)
        assert [s["name"] for s in doc["schedules"]] == seeded
        assert sum("'odd'" in d and "cannot be read" in d for d in doc["diagnosis"]) == 1


def test_missing_periods_that_left_the_hour_are_not_counted(
        engine, database_url, schema, cluster, seeded):
    """A row counts its missing periods still within the hour before status's now; when more
    have left than it kept the instants of, that schedule is audited live."""
    lead(engine, cluster)
    summarize(database_url, schema, seeded)
    with engine.connect() as conn:
        assert len(summaries_read(conn)["gappy"].missing_first) == 5
    with engine.begin() as conn:  # a sixth, from before the hour: it has left since
        conn.execute(sa.text(
            "UPDATE schedule_summaries SET missing_last_hour = 6, missing_first = "
            "array[now() - interval '61 minutes'] || missing_first WHERE schedule = 'gappy'"))
    doc = gather(engine, schema, cluster)
    assert doc["periods_missing_last_hour"]["gappy"] == 5 and doc["figures"]["summarized"] == 4
    with engine.begin() as conn:  # 100, of which it kept one, gone: it cannot tell
        conn.execute(sa.text(
            "UPDATE schedule_summaries SET missing_last_hour = 100, missing_first = "
            "array[now() - interval '61 minutes'] WHERE schedule = 'gappy'"))
    doc = gather(engine, schema, cluster)
    assert doc["periods_missing_last_hour"]["gappy"] == 5
    assert comparable(doc) == comparable(gather(engine, schema, cluster, use_summary=False))
