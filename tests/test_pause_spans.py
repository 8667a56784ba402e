"""Pause judged at each period's due instant (SPEC §4), against a real database: what `pause`
and `resume` write (schedule_controls and a span in schedule_pauses, one instant), how the
leader reads rows older releases left (controls paused with no span; a span an older resume
left open), and a leader, in process, that decides periods long after the pause ended."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import psycopg
import pytest

from cronkeeper.db import leadership as dbl
from cronkeeper.db.engine import leader_lock_key, normalize_url
from cronkeeper.db.schedule_pauses import pauses_prune, pauses_spans
from cronkeeper.db.schedule_versions import versions_insert
from cronkeeper.db.sessions import db_now
from cronkeeper.operations.control import set_paused
from cronkeeper.schedule.model import Misfire, ScheduleSpec
from cronkeeper.scheduler import Scheduler
from cronkeeper.term import Term

SPEC = ScheduleSpec(name="tick", timezone="UTC", misfire=Misfire.CATCH_UP, every=1.0,
                    task="t.tick")
S = timedelta(seconds=1)


@pytest.fixture
def raw(database_url, schema):
    with psycopg.connect(database_url, autocommit=True, options=f"-c search_path={schema}") as conn:
        yield conn


def record(raw, ago: timedelta = timedelta(seconds=30)) -> datetime:
    """The schedule's version, active from a whole second ``ago``: its first period follows."""
    base = (db_now(raw) - ago).replace(microsecond=0)
    versions_insert(raw, [(SPEC.name, SPEC.digest, SPEC.to_json())], base, term=1)
    return base


def controls(raw, paused: bool, changed_at: datetime) -> None:
    """A controls row as any release writes it (0.1.0 writes only this)."""
    raw.execute("INSERT INTO schedule_controls (schedule, paused, changed_at, changed_by) "
                "VALUES ('tick', %s, %s, 'test')", (paused, changed_at))


def span(raw, paused_at: datetime, resumed_at: datetime | None) -> None:
    raw.execute("INSERT INTO schedule_pauses (schedule, paused_at, resumed_at) "
                "VALUES ('tick', %s, %s)", (paused_at, resumed_at))


def spans_of(raw) -> list[tuple]:
    return raw.execute("SELECT paused_at, resumed_at FROM schedule_pauses "
                       "WHERE schedule = 'tick' ORDER BY paused_at").fetchall()


def decide(database_url, schema) -> dict[int, tuple[str, str | None]]:
    """One leader's term, in process: every period due since the version is decided now, in
    one catch-up; {seconds after the first period's second: (outcome, reason)}."""
    cluster = f"pause-{uuid.uuid4().hex[:8]}"
    conn = dbl.lock_connect(normalize_url(database_url), schema, f"test:{cluster}")
    try:
        key = leader_lock_key(schema, cluster)
        assert dbl.lock_wait(conn, key)
        term, _ = dbl.leadership_claim(conn, cluster, cluster)
        sched = Scheduler(Term(conn, term, cluster, key))
        sched.load_versions()
        sched.tick_until_current()
        rows = conn.execute("SELECT scheduled_for, outcome, reason FROM periods "
                            "WHERE schedule = 'tick' ORDER BY scheduled_for").fetchall()
        emitted = conn.execute("SELECT count(*), count(DISTINCT scheduled_for) FROM outbox "
                               "WHERE schedule = 'tick'").fetchone()
    finally:
        conn.close()
    assert emitted[0] == emitted[1] == sum(1 for r in rows if r[1] == "emitted")
    base = rows[0][0] - S
    return {int((r[0] - base).total_seconds()): (r[1], r[2]) for r in rows}


def paused_between(decided: dict, lo: int, hi: int) -> None:
    """Seconds [lo, hi) skipped (paused); every other one emitted."""
    assert len(decided) >= 25
    for second, outcome in decided.items():
        expected = ("skipped", "paused") if lo <= second < hi else ("emitted", None)
        assert outcome == expected, (second, outcome)


# -- the leader -----------------------------------------------------------------------------
def test_periods_due_inside_a_span_ended_before_the_leader_decides_them_are_skipped(
        database_url, schema, raw):
    """The outage case: the pause began and ended while no leader ran; the catch-up skips
    the span's periods (paused) and emits the ones before and after, each once. Before, the
    pause state at catch-up time (resumed) emitted them all."""
    base = record(raw)
    span(raw, base + 10 * S, base + 20 * S)
    controls(raw, False, base + 20 * S)
    paused_between(decide(database_url, schema), 10, 20)


def test_periods_due_before_a_pause_begun_before_the_leader_decides_them_are_emitted(
        database_url, schema, raw):
    """A pause that began after a period was due does not skip it, however late it is
    decided. Before, every period was skipped (paused at catch-up time)."""
    base = record(raw)
    span(raw, base + 10 * S, None)
    controls(raw, True, base + 10 * S)
    decided = decide(database_url, schema)
    paused_between(decided, 10, max(decided) + 1)


def test_controls_paused_with_no_span_is_paused_since_ever(database_url, schema, raw):
    """An older release's pause (schedule_controls only): every period is skipped, as that
    release judges it."""
    base = record(raw)
    controls(raw, True, base + 10 * S)
    decided = decide(database_url, schema)
    paused_between(decided, 0, max(decided) + 1)


def test_a_span_an_older_resume_left_open_ends_at_the_controls_change(
        database_url, schema, raw):
    """An older release's resume sets schedule_controls only: the span it left open counts as
    ended at the controls' changed_at. Before, nothing was paused at catch-up time."""
    base = record(raw)
    span(raw, base + 10 * S, None)
    controls(raw, False, base + 20 * S)
    assert pauses_spans(raw, base) == {"tick": ((base + 10 * S, base + 20 * S),)}
    paused_between(decide(database_url, schema), 10, 20)


def test_the_leader_reads_only_spans_that_can_hold_its_periods(raw):
    now = db_now(raw)
    span(raw, now - 100 * S, now - 90 * S)
    span(raw, now - 50 * S, now - 40 * S)
    assert pauses_spans(raw, now - 45 * S) == {"tick": ((now - 50 * S, now - 40 * S),)}
    assert pauses_spans(raw, now - 40 * S) == {}


# -- what pause and resume write -------------------------------------------------------------
def test_pause_and_resume_write_one_span_at_the_controls_instant(engine, raw):
    record(raw)
    set_paused(engine, "tick", True, "alice")
    paused, changed = raw.execute(
        "SELECT paused, changed_at FROM schedule_controls").fetchone()
    assert paused and spans_of(raw) == [(changed, None)]
    set_paused(engine, "tick", True, "alice")  # already paused: the span stands, no second one
    assert spans_of(raw) == [(changed, None)]
    set_paused(engine, "tick", False, "bob")
    paused, resumed = raw.execute(
        "SELECT paused, changed_at FROM schedule_controls").fetchone()
    assert not paused and spans_of(raw) == [(changed, resumed)] and resumed > changed
    set_paused(engine, "tick", False, "bob")  # already resumed: nothing more
    assert spans_of(raw) == [(changed, resumed)]
    assert pauses_spans(raw, changed) == {"tick": ((changed, resumed),)}


def test_resuming_an_older_releases_pause_records_it_as_paused_since_ever(engine, raw):
    base = record(raw)
    controls(raw, True, base)
    set_paused(engine, "tick", False, "bob")
    (resumed,) = raw.execute("SELECT changed_at FROM schedule_controls").fetchone()
    assert raw.execute("SELECT isfinite(paused_at), resumed_at FROM schedule_pauses"
                       ).fetchall() == [(False, resumed)]
    assert pauses_spans(raw, base) == {"tick": ((None, resumed),)}


def test_pausing_again_after_an_older_releases_pause_keeps_it_since_ever(engine, raw):
    base = record(raw)
    controls(raw, True, base)
    set_paused(engine, "tick", True, "alice")
    assert pauses_spans(raw, base) == {"tick": ((None, None),)}


def test_pausing_after_an_older_releases_resume_closes_the_span_it_left_open(engine, raw):
    base = record(raw)
    span(raw, base, None)
    controls(raw, False, base + 5 * S)
    set_paused(engine, "tick", True, "alice")
    (paused_at,) = raw.execute("SELECT changed_at FROM schedule_controls").fetchone()
    assert spans_of(raw) == [(base, base + 5 * S), (paused_at, None)]


def test_resuming_again_after_an_older_releases_resume_keeps_its_instant(engine, raw):
    base = record(raw)
    span(raw, base, None)
    controls(raw, False, base + 5 * S)
    set_paused(engine, "tick", False, "bob")
    assert spans_of(raw) == [(base, base + 5 * S)]


def test_spans_resumed_before_the_periods_retention_are_pruned(raw):
    now = db_now(raw)
    span(raw, now - timedelta(days=500), now - timedelta(days=450))
    span(raw, now - timedelta(days=300), now - timedelta(days=200))
    span(raw, now - timedelta(days=600), None)  # still paused: kept
    assert pauses_prune(raw, days=400, batch=100) == 1
    assert [r[1] for r in spans_of(raw)] == [None, now - timedelta(days=200)]
