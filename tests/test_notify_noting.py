"""Notifications are written by the statements that record their events (docs/notifications.md),
against a real PostgreSQL: one ``dead`` per schedule until it recovers, the rest counted; the
recovery carries the count; jobs without a schedule grouped by task; every path that makes a
dead letter (a worker's or relay's failure, the reaper, a relay's target reporting failure) or a
success notes it; nothing is noted without ``note``; concurrent workers neither double-notify
nor deadlock, and the statements lock jobs in one order."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from cronkeeper.db import outbox as dbo
from cronkeeper.db import outbox_claims as claims
from cronkeeper.db import outbox_endings as endings
from cronkeeper.db.notifications import (
    Skipped,
    notifications_note_missed,
    notifications_note_missing,
)


def add_jobs(engine, *jobs: tuple[str | None, str, str | None]) -> list[int]:
    """Outbox rows (schedule, task, owner), due now, one attempt each."""
    ids = []
    with engine.begin() as conn:
        for n, (schedule, task, owner) in enumerate(jobs):
            ids.append(conn.exec_driver_sql(
                "INSERT INTO outbox (idempotency_key, schedule, task, owner, max_attempts) "
                "VALUES (%(k)s, %(s)s, %(t)s, %(o)s, 1) RETURNING id",
                {"k": f"{schedule or task}@{n}-{datetime.now(UTC).timestamp()}", "s": schedule,
                 "t": task, "o": owner}).scalar())
    return ids


def claim_all(engine, worker="w1") -> list[claims.OutboxJob]:
    with engine.begin() as conn:
        return claims.outbox_claim(conn, worker_id=worker, limit=1000, lease_margin=30)


def dead(job: claims.OutboxJob, error: str = "boom") -> endings.Failure:
    return endings.Failure(job.id, job.attempt, "dead", 0.0, error, "dead")


def fail(engine, jobs, worker="w1", note=True) -> list[int]:
    with engine.begin() as conn:
        return endings.outbox_fail(conn, worker_id=worker, failures=[dead(j) for j in jobs],
                                   note=note)


def complete(engine, jobs, worker="w1", note=True) -> list[int]:
    with engine.begin() as conn:
        return endings.outbox_complete(conn, worker_id=worker, ids=[j.id for j in jobs],
                                       attempts=[j.attempt for j in jobs], note=note)


def notes(engine) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.exec_driver_sql(
            "SELECT event, schedule, task, owner, key, attempts, error, count, window_from, "
            "window_until, state FROM notifications ORDER BY id")]


def subjects(engine) -> dict[tuple[str, str], tuple[int, int]]:
    with engine.connect() as conn:
        return {(k, n): (d, s) for k, n, d, s in conn.exec_driver_sql(
            "SELECT kind, name, dead_letters, suppressed_total FROM notification_subjects")}


def test_one_dead_per_schedule_until_it_recovers_and_the_recovery_carries_the_count(engine):
    add_jobs(engine, ("nightly", "billing.run", "team-billing"))
    [first] = claim_all(engine)
    fail(engine, [first])
    got = notes(engine)
    assert [(n["event"], n["schedule"], n["task"], n["owner"], n["attempts"], n["error"])
            for n in got] == [("dead", "nightly", "billing.run", "team-billing", 1, "boom")]
    assert got[0]["key"] == first.key and got[0]["count"] == 1

    for _ in range(3):  # a flood: counted, not sent
        add_jobs(engine, ("nightly", "billing.run", "team-billing"))
        fail(engine, claim_all(engine))
    assert len(notes(engine)) == 1
    assert subjects(engine) == {("schedule", "nightly"): (4, 3)}

    add_jobs(engine, ("nightly", "billing.run", "team-billing"))
    ok = claim_all(engine)
    complete(engine, ok)
    recovered = notes(engine)[1]
    assert recovered["event"] == "recovered" and recovered["count"] == 3
    assert recovered["key"] == ok[0].key
    assert recovered["window_from"] is not None and recovered["window_until"] >= recovered["window_from"]
    assert subjects(engine) == {("schedule", "nightly"): (0, 3)}

    add_jobs(engine, ("nightly", "billing.run", "team-billing"))  # a success while well: nothing
    complete(engine, claim_all(engine))
    add_jobs(engine, ("nightly", "billing.run", "team-billing"))  # dead again: told again
    fail(engine, claim_all(engine))
    assert [n["event"] for n in notes(engine)] == ["dead", "recovered", "dead"]


def test_a_batch_of_dead_letters_of_one_schedule_is_one_notification_and_others_are_their_own(engine):
    add_jobs(engine, *[("a", "t", None)] * 5, ("b", "t", None), (None, "mail.send", None),
             (None, "mail.send", None))
    fail(engine, claim_all(engine))
    got = notes(engine)
    assert sorted((n["schedule"] or "", n["task"]) for n in got) == [
        ("", "mail.send"), ("a", "t"), ("b", "t")]
    assert subjects(engine) == {("schedule", "a"): (5, 4), ("schedule", "b"): (1, 0),
                                ("task", "mail.send"): (2, 1)}


def test_a_job_without_a_schedule_recovers_its_task(engine):
    add_jobs(engine, (None, "mail.send", None))
    fail(engine, claim_all(engine))
    add_jobs(engine, (None, "mail.send", None), (None, "other", None))
    complete(engine, claim_all(engine))
    assert [(n["event"], n["task"], n["count"]) for n in notes(engine)] == [
        ("dead", "mail.send", 1), ("recovered", "mail.send", 0)]


def test_without_note_nothing_is_written(engine):
    add_jobs(engine, ("a", "t", None))
    fail(engine, claim_all(engine), note=False)
    add_jobs(engine, ("a", "t", None))
    complete(engine, claim_all(engine), note=False)
    assert notes(engine) == [] and subjects(engine) == {}


def test_a_fence_that_refuses_the_ending_notes_nothing(engine):
    add_jobs(engine, ("a", "t", None))
    jobs = claim_all(engine)
    assert fail(engine, jobs, worker="someone-else") == []
    assert notes(engine) == []


def test_the_reaper_notes_a_lease_that_expired_at_the_attempt_cap(engine):
    add_jobs(engine, ("lost", "t", "ops@example.com"))
    claim_all(engine)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE outbox SET lease_expires_at = now() - interval '1 minute'")
        assert claims.outbox_reap_expired(conn, restart_grace=0, note=True) == 1
    [note] = notes(engine)
    assert (note["event"], note["schedule"], note["owner"]) == ("dead", "lost", "ops@example.com")
    assert note["error"].startswith("lease expired: worker w1")


def test_a_relay_target_reporting_failure_then_success_notes_both(engine):
    ids = add_jobs(engine, ("relayed", "t", None), ("relayed", "t", None))
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE outbox SET state = 'published', published_at = now(), "
                             "published_to = 'celery', target_id = 'x'")
        assert dbo.outbox_published_finish(conn, ids=[ids[0]], states=["dead"], note=True) == 1
        assert dbo.outbox_published_finish(conn, ids=[ids[1]], states=["succeeded"], note=True) == 1
    assert [(n["event"], n["error"]) for n in notes(engine)] == [
        ("dead", "the target reported the task failed (celery id x)"), ("recovered", None)]


def test_concurrent_workers_tell_each_schedule_once_and_do_not_deadlock(engine, database_url):
    """Eight workers dead-letter jobs of the same 20 schedules at once, each in its own order:
    one notification per schedule, every dead letter counted."""
    names = [f"s{i:02d}" for i in range(20)]
    per_worker: dict[str, list] = {}
    for w in range(8):
        add_jobs(engine, *[(n, "t", None) for n in names])
        per_worker[f"w{w}"] = claim_all(engine, worker=f"w{w}")
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def run(worker: str, jobs: list) -> None:
        order = jobs if int(worker[1:]) % 2 else list(reversed(jobs))
        barrier.wait()
        try:
            fail(engine, order, worker=worker)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=item) for item in per_worker.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(n["schedule"] for n in notes(engine)) == names
    assert subjects(engine) == {("schedule", n): (8, 7) for n in names}


def test_missed_periods_merge_into_one_waiting_notification_per_schedule(engine):
    t0 = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    first = [Skipped("a", "t", "ops", 3, t0, t0 + timedelta(minutes=2)),
             Skipped("b", "t", None, 1, t0, t0)]
    with engine.begin() as conn:
        assert notifications_note_missed(conn, first) == (0, 2)
    with engine.begin() as conn:  # the next tick of the same outage
        assert notifications_note_missed(conn, [Skipped("a", "t", "ops", 2, t0 + timedelta(
            minutes=3), t0 + timedelta(minutes=4))]) == (1, 0)
    got = {n["schedule"]: n for n in notes(engine)}
    assert got["a"]["count"] == 5 and got["a"]["window_from"] == t0
    assert got["a"]["window_until"] == t0 + timedelta(minutes=4)
    with engine.begin() as conn:  # once tried (sending, or sent), a new outage is a new one
        conn.exec_driver_sql("UPDATE notifications SET tries = 1, state = 'sent'")
        assert notifications_note_missed(conn, [Skipped("a", "t", "ops", 1, t0, t0)]) == (0, 1)


def test_each_missing_period_is_told_once(engine):
    t0 = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    with engine.begin() as conn:
        assert notifications_note_missing(conn, [Skipped("a", "t", None, 2, t0, t0 + timedelta(
            minutes=1))]) == 1
        # the audit five minutes later finds the same periods and one more
        assert notifications_note_missing(conn, [Skipped("a", "t", None, 2, t0, t0 + timedelta(
            minutes=1))]) == 0
        assert notifications_note_missing(conn, [Skipped("a", "t", None, 1, t0 + timedelta(
            minutes=2), t0 + timedelta(minutes=2))]) == 1
    assert [(n["event"], n["count"]) for n in notes(engine)] == [("missing", 2), ("missing", 1)]


class _Term:
    """What the missing watch uses of a term: its connection, confirm (the database's now),
    progress, number."""

    def __init__(self, conn) -> None:
        self.conn, self.number, self.steps = conn, 1, 0

    def confirm(self):
        return self.conn.execute("SELECT now()").fetchone()[0]

    def progress(self) -> None:
        self.steps += 1


def test_the_leaders_audit_tells_each_missing_period_once(engine, database_url, schema):
    """Periods due beyond grace with no outcome in the last 24 hours are told, as one missing
    notification per schedule and audit; the next pass tells only periods newly missing, and a
    new term's first pass (24 hours back) does not tell those again. The audit is the leader's
    summarizer's: the same pass keeps the last hour's count for status and the metrics."""
    import json

    import psycopg
    import sqlalchemy as sa
    from conftest import libpq_url

    from cronkeeper.db.schedule_summaries import summaries_read
    from cronkeeper.schedule.model import Misfire, ScheduleSpec
    from cronkeeper.summarizer import Summarizer

    every = ScheduleSpec(name="gappy", every=60, timezone="UTC", misfire=Misfire.SKIP,
                         task="t.x", grace=10, owner="team-a")
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        start = (now - timedelta(minutes=30)).replace(second=0, microsecond=0)
        version = conn.execute(sa.text(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('gappy', :d, CAST(:j AS jsonb), :a, 1) RETURNING id"),
            {"d": every.digest, "j": json.dumps(every.to_json()), "a": start}).scalar_one()
        for n in range(31):  # every minute decided but 10..14 (five missing)
            at = start + timedelta(minutes=n)
            if at < now - timedelta(seconds=10) and not 10 <= n <= 14:
                conn.execute(sa.text(
                    "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, term) "
                    "VALUES ('gappy', :t, :v, 'emitted', 1)"), {"t": at, "v": version})
    with psycopg.connect(libpq_url(database_url), options=f"-c search_path={schema}") as conn:
        term = _Term(conn)
        watch = Summarizer(notify=True)
        watch.step(term, ["gappy"])
        got = notes(engine)
        assert [(n["event"], n["schedule"], n["task"], n["owner"], n["count"]) for n in got] == [
            ("missing", "gappy", "t.x", "team-a", 5)]
        assert got[0]["window_from"] == start + timedelta(minutes=10)
        assert got[0]["window_until"] == start + timedelta(minutes=14)
        assert term.steps == 1  # the step fed the stall watchdog
        with engine.connect() as c:
            assert summaries_read(c)["gappy"].missing_last_hour == 5
        watch._next = 0.0  # the next pass is due (not waited for)
        watch.step(term, ["gappy"])
        Summarizer(notify=True).step(term, ["gappy"])  # a new term: 24 hours back
        assert len(notes(engine)) == 1
        with engine.begin() as c:  # a period decided earlier is lost (a failover, say)
            c.execute(sa.text("DELETE FROM periods WHERE scheduled_for = :t"),
                      {"t": start + timedelta(minutes=20)})
        fresh = Summarizer(notify=True)
        fresh.step(term, ["gappy"])
        assert [(n["event"], n["count"]) for n in notes(engine)] == [("missing", 5), ("missing", 1)]
