"""Wake-ups, the sending side: every statement that makes a job available sends one NOTIFY on the
schema's channel, delivered at commit; a rolled-back transaction, or a statement that makes
nothing available (a claim, a completion, a duplicate key), sends none. A test session LISTENs
and counts what arrives."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from claim_rows import Row, batch, flat

import cronkeeper
from cronkeeper.db import outbox, outbox_endings, periods_claims
from cronkeeper.db import outbox_claims as db
from cronkeeper.db.schedule_versions import versions_insert
from cronkeeper.db.wake import wake_channel


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@pytest.fixture
def listener(database_url, schema):
    """A LISTENing session; ``heard()`` returns how many notifications arrived since the last
    call (it waits briefly: a notification is delivered when the sender commits, which has
    happened before ``heard()`` is called, so this wait only has to cover the socket)."""
    conn = psycopg.connect(plain(database_url), autocommit=True)
    conn.execute(f'LISTEN "{wake_channel(schema)}"')
    other = psycopg.connect(plain(database_url), autocommit=True)
    other.execute('LISTEN "cronkeeper.some_other_schema"')

    def heard() -> list[str]:
        got = [n.channel for n in conn.notifies(timeout=0.5)]
        assert [n.channel for n in other.notifies(timeout=0)] == [], "another schema's channel"
        return got

    yield heard
    conn.close()
    other.close()


@pytest.fixture
def raw(database_url, schema):
    """A psycopg session on the schema (as the worker's and the leader's are)."""
    conn = psycopg.connect(plain(database_url), autocommit=True, options=f"-c search_path={schema}")
    yield conn
    conn.close()


def test_channel_is_per_schema_and_fits_an_identifier():
    assert wake_channel("cronkeeper") == "cronkeeper.cronkeeper"
    assert wake_channel("a" * 63).startswith("cronkeeper.aaa") and len(wake_channel("a" * 63)) == 63


def test_one_notify_per_committed_transaction_none_on_rollback(engine, schema, listener, database_url):
    channel = wake_channel(schema)
    with engine.begin() as conn:  # 2,000 jobs, three statements, one transaction
        cronkeeper.enqueue_many(conn, [{"task": "t", "key": f"a{n}"} for n in range(1000)], schema=schema)
        cronkeeper.enqueue_many(conn, [{"task": "t", "key": f"b{n}"} for n in range(1000)], schema=schema)
        cronkeeper.enqueue(conn, "t", {}, key="c", schema=schema)
    assert listener() == [channel]
    with engine.connect() as conn:
        cronkeeper.enqueue(conn, "t", {}, key="rolled-back", schema=schema)
        cronkeeper.enqueue_many(conn, [{"task": "t", "key": "rolled-back-2"}], schema=schema)
        conn.rollback()
    assert listener() == []
    with psycopg.connect(plain(database_url)) as conn:  # psycopg, a transaction each
        cronkeeper.enqueue(conn, "t", {}, key="d", schema=schema)
        conn.commit()
        cronkeeper.enqueue(conn, "t", {}, key="e", schema=schema, run_after=timedelta(seconds=30))
        conn.commit()
    # A job due later wakes idle workers too: they sleep until its run_after, not a whole poll.
    assert listener() == [channel, channel]
    with engine.begin() as conn:  # only duplicates: no new job, no wake-up
        assert cronkeeper.enqueue(conn, "t", {}, key="c", schema=schema) is None
        assert cronkeeper.enqueue_many(conn, [{"task": "t", "key": "a1"}], schema=schema) == [None]
    assert listener() == []


def test_worker_statements_notify_only_when_they_make_a_job_available(engine, schema, listener, raw):
    channel = wake_channel(schema)
    with engine.begin() as conn:
        cronkeeper.enqueue_many(conn, [{"task": "t", "key": f"k{n}"} for n in range(4)], schema=schema)
    assert listener() == [channel]

    jobs = db.outbox_claim(raw, worker_id="w", limit=4, lease_margin=30)
    assert len(jobs) == 4 and listener() == []  # a claim makes nothing available
    first, second, third, fourth = jobs
    assert outbox_endings.outbox_complete(raw, worker_id="w", ids=[first.id], attempts=[1]) == [first.id]
    assert listener() == []

    dead = outbox_endings.Failure(second.id, 1, "dead", 0.0, "boom", "dead")
    assert outbox_endings.outbox_fail(raw, worker_id="w", failures=[dead]) == [second.id]
    assert listener() == []  # a dead letter is not available
    retry = outbox_endings.Failure(third.id, 1, "available", 0.0, "503", "retry")
    assert outbox_endings.outbox_fail(raw, worker_id="w", failures=[retry]) == [third.id]
    assert listener() == [channel]  # a retry due now

    raw.execute("UPDATE outbox SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
                (fourth.id,))
    assert db.outbox_reap_expired(raw) == 1
    assert listener() == [channel]  # a reaped lease
    assert db.outbox_reap_expired(raw) == 0
    assert listener() == []

    assert outbox.outbox_dead_replay(raw, [second.id]) == [second.id]
    assert listener() == [channel]  # a dead letter replayed
    assert outbox.outbox_dead_replay(raw, [second.id]) == []
    assert listener() == []


def test_the_leaders_claim_and_a_manual_trigger_notify(schema, listener, raw):
    channel = wake_channel(schema)
    now = datetime.now(UTC).replace(microsecond=0)
    ids = versions_insert(raw, [("tick", "d1", {"task": "t"})], now - timedelta(hours=1), 1)

    def period(at: datetime, outcome: str = "emitted") -> Row:
        emitted = outcome == "emitted"
        return Row(
            schedule="tick", scheduled_for=at, version_id=ids["tick"], outcome=outcome,
            reason=None if emitted else "misfire", key=f"tick@{at:%Y-%m-%dT%H:%M:%SZ}" if emitted else None,
            task="t" if emitted else None, payload_json="{}" if emitted else None,
            max_attempts=5 if emitted else None, run_after=at if emitted else None,
            timeout=60.0 if emitted else None, backoff_json=json.dumps({"base": 1}) if emitted else None,
            serial=False if emitted else None, owner=None,
        )

    def statement(rows: list[Row]) -> list[periods_claims.Claim]:
        return flat(periods_claims._periods_claim_statement(raw, [batch(rows)], 1))

    with raw.transaction():
        claimed = statement([period(now - timedelta(minutes=m)) for m in range(3)])
    assert len(claimed) == 3 and listener() == [channel]
    with raw.transaction():  # the same periods again: no row back, no job, no wake-up
        assert statement([period(now - timedelta(minutes=m)) for m in range(3)]) == []
    assert listener() == []
    with raw.transaction():  # a period recorded as skipped writes no job
        assert len(statement([period(now - timedelta(minutes=9), "skipped")])) == 1
    assert listener() == []
    # periods_claim writes by COPY; a conflict falls back to the statement above
    def copied(rows: list[Row]) -> list[periods_claims.Claim]:
        with raw.transaction():
            return flat(periods_claims.periods_claim(raw, [batch(rows)], 1))

    assert len(copied([period(now - timedelta(minutes=m)) for m in range(3, 6)])) == 3
    assert listener() == [channel]
    assert copied([period(now - timedelta(minutes=m)) for m in range(3, 6)]) == []
    assert listener() == []
    assert len(copied([period(now - timedelta(minutes=19), "skipped")])) == 1
    assert listener() == []
    with pytest.raises(RuntimeError), raw.transaction():  # rolled back: no wake-up either
        periods_claims.periods_claim(raw, [batch([period(now - timedelta(minutes=29))])], 1)
        raise RuntimeError("the tick failed after its claims")
    assert listener() == [] and copied([period(now - timedelta(minutes=29))]) != []
    assert listener() == [channel]
    with raw.transaction():
        manual = period(now + timedelta(seconds=1))
        outbox.outbox_insert_manual(raw, key=manual.key, schedule="tick",
                                    scheduled_for=manual.scheduled_for, version_id=ids["tick"],
                                    run_after=manual.scheduled_for, job=manual.job())
    assert listener() == [channel]
