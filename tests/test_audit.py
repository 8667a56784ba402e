"""The audit as a pure function: expected periods from versions, merged with records (§9)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronkeeper.audit import (
    Record,
    Version,
    Window,
    audit,
    audit_schedule,
    fire_seconds,
    iso_second,
    iso_unix,
    parse_since,
    records_from_rows,
)
from cronkeeper.schedule.model import Misfire, ScheduleSpec

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def spec(every: float = 60, grace: float = 10, **kw) -> ScheduleSpec:
    return ScheduleSpec(name="s", every=every, timezone="UTC", misfire=Misfire.SKIP,
                        task="t.x", grace=grace, owner="team-a", **kw)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def run(versions, records, since, until, now):
    rows, summary = audit_schedule("s", versions, records, since=since, until=until, now=now)
    return [(r.scheduled_for, r.status, r.reason) for r in rows], summary


def test_each_status():
    v = [Version("s", 1, spec(), at(0))]
    records = [
        Record.of(at(1), "emitted", None, at(1) + timedelta(seconds=0.25), "succeeded", 1),
        Record.of(at(2), "skipped", "overlap"),
        # 3: nothing recorded, due long ago: missing
        Record.of(at(4), "emitted", None, at(4) + timedelta(seconds=2), "dead", 5),
    ]
    now = at(5) + timedelta(seconds=5)  # period 5 is 5 s old, within its 10 s grace
    rows, summary = audit_schedule("s", v, records, since=at(0), until=now, now=now)
    assert [(r.scheduled_for, r.status, r.reason) for r in rows] == [
        ("2026-03-01T12:01:00Z", "emitted", None),
        ("2026-03-01T12:02:00Z", "skipped", "overlap"),
        ("2026-03-01T12:03:00Z", "missing", None),
        ("2026-03-01T12:04:00Z", "emitted", None),
        ("2026-03-01T12:05:00Z", "pending", None),
    ]
    assert rows[0].emitted_at == "2026-03-01T12:01:00.250Z"
    assert rows[0].lag_seconds == 0.25
    assert (rows[0].job_state, rows[0].attempts) == ("succeeded", 1)
    assert (rows[3].job_state, rows[3].attempts) == ("dead", 5)
    assert (summary.emitted, summary.skipped, summary.pending, summary.missing, summary.dead) == (
        2, 1, 1, 1, 1)
    assert summary.owner == "team-a"


def test_first_period_is_strictly_after_active_from():
    v = [Version("s", 1, spec(), at(1))]  # adopted exactly at 12:01:00
    rows, _ = run(v, [], at(0), at(3), at(10))
    assert [r[0] for r in rows] == ["2026-03-01T12:02:00Z", "2026-03-01T12:03:00Z"]


def test_changed_mid_window_each_period_by_the_version_in_force():
    v = [Version("s", 1, spec(every=60), at(0)),
         Version("s", 2, spec(every=120), at(3) + timedelta(seconds=30))]
    rows, _ = run(v, [], at(0), at(8), at(20))
    # every minute up to 12:03 (the old version), then even minutes after 12:03:30
    assert [r[0][11:16] for r in rows] == ["12:01", "12:02", "12:03", "12:04", "12:06", "12:08"]


def test_period_at_the_instant_the_next_version_starts_belongs_to_the_old_one():
    v = [Version("s", 1, spec(every=60), at(0)), Version("s", 2, spec(every=60), at(2))]
    rows, _ = run(v, [], at(0), at(3), at(20))
    assert [r[0][11:16] for r in rows] == ["12:01", "12:02", "12:03"]


def test_removed_schedule_expects_nothing_after_removal():
    v = [Version("s", 1, spec(), at(0)), Version("s", 2, None, at(2) + timedelta(seconds=1))]
    rows, _ = run(v, [], at(0), at(10), at(20))
    assert [r[0][11:16] for r in rows] == ["12:01", "12:02"]


def test_paused_stretch_is_skipped_not_missing():
    v = [Version("s", 1, spec(), at(0))]
    records = [Record.of(at(m), "skipped", "paused") for m in (1, 2, 3)]
    rows, summary = run(v, records, at(0), at(3), at(10))
    assert [r[1:] for r in rows] == [("skipped", "paused")] * 3
    assert summary.missing == 0


def test_recorded_period_no_version_implies_is_still_listed():
    v = [Version("s", 1, spec(), at(0))]
    extra = Record.of(at(1) + timedelta(seconds=30), "emitted", "backfill", at(5))
    rows, _ = run(v, [Record.of(at(1), "emitted", None, at(1)), extra], at(0), at(2), at(10))
    assert [r[0][11:19] for r in rows] == ["12:01:00", "12:01:30", "12:02:00"]
    assert rows[1][1:] == ("emitted", "backfill")


def test_window_is_inclusive_and_cut_at_now():
    v = [Version("s", 1, spec(), at(-10))]
    rows, _ = run(v, [], at(2), at(100), at(4))
    assert [r[0][11:16] for r in rows] == ["12:02", "12:03", "12:04"]


def test_retention_horizon_cuts_the_window_and_says_so():
    now = at(0)
    v = {"s": [Version("s", 1, spec(every=86400), now - timedelta(days=900))]}
    result = audit(v, {}, Window(now - timedelta(days=500), now, now, retention_days=400))
    assert len(result.rows) == 400
    assert result.notes and "retention horizon" in result.notes[0]
    short = audit(v, {}, Window(now - timedelta(days=10), now, now, retention_days=400))
    assert short.notes == []


def test_fire_seconds_agrees_with_fires():
    for s in (spec(every=90), ScheduleSpec(name="c", cron="*/7 1-3 * * *", timezone="America/New_York",
                                            misfire=Misfire.SKIP, task="t")):
        trig = s.trigger()
        a, b = datetime(2026, 3, 7, tzinfo=UTC), datetime(2026, 3, 10, 12, tzinfo=UTC)
        assert list(fire_seconds(trig, a, b)) == [int(t.timestamp()) for t in trig.fires(a, b)]


def test_iso_formatting():
    assert iso_second(0) == "1970-01-01T00:00:00Z"
    assert iso_unix(at(0).timestamp() + 0.0004) == "2026-03-01T12:00:00Z"
    assert iso_unix(at(0).timestamp() + 0.9996) == "2026-03-01T12:00:01Z"
    assert iso_unix(at(0).timestamp() + 0.5) == "2026-03-01T12:00:00.500Z"


def test_duplicate_records_keep_the_first():
    rows = [(1, "emitted"), (1, "emitted-again"), (2, "skipped")]
    assert records_from_rows(rows) == [(1, "emitted"), (2, "skipped")]


@pytest.mark.parametrize("text,expected", [
    ("24h", at(0) - timedelta(hours=24)),
    ("90m", at(0) - timedelta(minutes=90)),
    ("2026-02-01T00:00:00Z", datetime(2026, 2, 1, tzinfo=UTC)),
])
def test_parse_since(text, expected):
    assert parse_since(text, at(0)) == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-02-01T00:00:00", "-5m"])
def test_parse_since_refuses(text):
    with pytest.raises(ValueError):
        parse_since(text, at(0))


def test_audit_imports_nothing_from_the_shell():
    import ast
    from pathlib import Path

    import cronkeeper.audit as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    names = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    names += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [n for n in names if n.startswith(("cronkeeper.db", "cronkeeper.cli",
                                                   "cronkeeper.worker", "sqlalchemy", "psycopg"))]
