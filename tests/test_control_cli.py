"""pause / resume / trigger / backfill against a real database, through the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli
from cronkeeper.db.schedule_controls import controls_paused
from cronkeeper.db.schedule_versions import versions_insert
from cronkeeper.db.sessions import db_now
from cronkeeper.schedule.model import Misfire, ScheduleSpec


@pytest.fixture
def raw(database_url, schema):
    with psycopg.connect(database_url, autocommit=True, options=f"-c search_path={schema}") as conn:
        yield conn


def record_version(raw, spec: ScheduleSpec, ago: timedelta):
    now = db_now(raw)
    ids = versions_insert(raw, [(spec.name, spec.digest, spec.to_json())], now - ago, term=1)
    return ids[spec.name], now


def invoke(database_url, schema, *args):
    result = CliRunner().invoke(cli, [*args, "--database-url", database_url, "--schema", schema])
    assert "Traceback" not in result.output
    return result


SPEC = ScheduleSpec(name="report", timezone="UTC", misfire=Misfire.SKIP, every=600.0, task="t.report")


def test_pause_and_resume_set_the_control_row(database_url, schema, raw):
    record_version(raw, SPEC, timedelta(hours=1))
    assert invoke(database_url, schema, "pause", "report").exit_code == 0
    assert controls_paused(raw) == {"report"}
    assert invoke(database_url, schema, "resume", "report").exit_code == 0
    assert controls_paused(raw) == set()


def test_pause_of_an_unknown_schedule_names_the_close_one(database_url, schema, raw):
    record_version(raw, SPEC, timedelta(hours=1))
    result = invoke(database_url, schema, "pause", "reprot")
    assert result.exit_code == 1
    assert "did you mean 'report'" in result.output
    assert controls_paused(raw) == set()


def test_trigger_writes_one_manual_job_each_time(database_url, schema, raw):
    version_id, _ = record_version(raw, SPEC, timedelta(hours=1))
    assert invoke(database_url, schema, "trigger", "report").exit_code == 0
    assert invoke(database_url, schema, "trigger", "report").exit_code == 0
    rows = raw.execute("SELECT idempotency_key, task, version_id, state FROM outbox").fetchall()
    assert len(rows) == 2
    assert all(k.startswith("report@manual:") and t == "t.report" and v == version_id and s == "available"
               for k, t, v, s in rows)
    assert raw.execute("SELECT count(*) FROM periods").fetchone()[0] == 0


def test_backfill_emits_only_periods_without_an_outcome_and_never_twice(database_url, schema, raw):
    version_id, now = record_version(raw, SPEC, timedelta(hours=1))
    periods = list(SPEC.trigger().fires(now - timedelta(hours=1), now))
    assert len(periods) == 6  # (now - 1h, now] holds exactly six 10-minute marks
    # one period already has an outcome (skipped by misfire): backfill must leave it alone
    raw.execute(
        "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, term) "
        "VALUES ('report', %s, %s, 'skipped', 'misfire', 1)",
        (periods[2], version_id),
    )
    window = ["--from", (now - timedelta(hours=2)).isoformat(), "--to", now.isoformat()]
    dry = invoke(database_url, schema, "backfill", "report", *window, "--dry-run", "--format", "json")
    assert dry.exit_code == 0, dry.output
    assert len(json.loads(dry.output)["periods"]) == 5
    assert raw.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0

    first = invoke(database_url, schema, "backfill", "report", *window, "--format", "json")
    assert first.exit_code == 0, first.output
    assert len(json.loads(first.output)["periods"]) == 5
    again = invoke(database_url, schema, "backfill", "report", *window, "--format", "json")
    assert json.loads(again.output)["periods"] == []
    jobs = raw.execute("SELECT scheduled_for FROM outbox ORDER BY 1").fetchall()
    assert [j[0] for j in jobs] == [p for i, p in enumerate(periods) if i != 2]
    reasons = raw.execute("SELECT reason, count(*) FROM periods GROUP BY 1 ORDER BY 1").fetchall()
    assert reasons == [("backfill", 5), ("misfire", 1)]


def test_backfill_and_trigger_state_their_instants_in_utc_whatever_the_sessions_zone(
        database_url, schema, raw, monkeypatch):
    """A session in another time zone (PGTZ: libpq sets it at connect) reads instants back in
    that zone: backfill's list and trigger's key still say UTC, as their ``Z`` claims."""
    _, now = record_version(raw, SPEC, timedelta(hours=1))
    monkeypatch.setenv("PGTZ", "Asia/Tokyo")
    window = ["--from", (now - timedelta(hours=1)).isoformat(), "--to", now.isoformat()]
    result = invoke(database_url, schema, "backfill", "report", *window, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["periods"] == [
        p.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for p in SPEC.trigger().fires(now - timedelta(hours=1), now)]
    assert invoke(database_url, schema, "trigger", "report").exit_code == 0
    (key,) = raw.execute(
        "SELECT idempotency_key FROM outbox WHERE idempotency_key LIKE 'report@manual:%'").fetchone()
    stamp = datetime.strptime(key.split("@manual:")[1], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert abs(stamp.replace(tzinfo=UTC) - db_now(raw)) < timedelta(hours=1)  # Tokyo is +9 h


def test_backfill_rejects_a_naive_instant(database_url, schema, raw):
    record_version(raw, SPEC, timedelta(hours=1))
    result = invoke(database_url, schema, "backfill", "report", "--from", "2026-01-01T00:00", "--to", "2026-01-02T00:00Z")
    assert result.exit_code == 2
    assert "has no offset" in result.output
