"""`cronkeeper history` on a real database seeded with every status (§9): emitted, skipped for
each reason, pending, missing, a dead job, a schedule changed mid-window and a paused stretch."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from cronkeeper.cli.main import cli
from cronkeeper.schedule.model import Misfire, ScheduleSpec


def spec(name: str, every: float, grace: float = 10, owner: str = "team-a") -> ScheduleSpec:
    return ScheduleSpec(name=name, every=every, timezone="UTC", misfire=Misfire.SKIP,
                        task="t.x", grace=grace, owner=owner)


def add_version(conn, s: ScheduleSpec | None, name: str, active_from) -> int:
    return conn.execute(sa.text(
        "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
        "VALUES (:n, :d, CAST(:j AS jsonb), :a, 1) RETURNING id"),
        {"n": name, "d": s.digest if s else "removed", "j": json.dumps(s.to_json()) if s else None,
         "a": active_from}).scalar_one()


def add_period(conn, name, version, when, outcome, reason=None, job=None, lag=0.5):
    conn.execute(sa.text(
        "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, decided_at, "
        "term) VALUES (:n, :t, :v, :o, :r, :d, 1)"),
        {"n": name, "t": when, "v": version, "o": outcome, "r": reason,
         "d": when + timedelta(seconds=lag)})
    if job:
        state, attempts = job
        conn.execute(sa.text(
            "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, "
            "state, attempts, created_at, run_after, owner) VALUES "
            "(:k, :n, :t, :v, 't.x', :s, :a, :c, :t, 'team-a')"),
            {"k": f"{name}@{when.isoformat()}", "n": name, "t": when, "v": version, "s": state,
             "a": attempts, "c": when + timedelta(seconds=lag)})


@pytest.fixture
def seeded(engine):
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        base = (now - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
        m = lambda n: base + timedelta(minutes=n)  # noqa: E731
        v1 = add_version(conn, spec("alpha", 60), "alpha", base)
        add_period(conn, "alpha", v1, m(1), "emitted", job=("succeeded", 1))
        add_period(conn, "alpha", v1, m(2), "skipped", "overlap")
        # m(3): no outcome at all -> missing
        add_period(conn, "alpha", v1, m(4), "emitted", job=("dead", 5))
        for n in (5, 6, 7):  # the paused stretch
            add_period(conn, "alpha", v1, m(n), "skipped", "paused")
        add_period(conn, "alpha", v1, m(8), "skipped", "misfire", lag=400)
        add_period(conn, "alpha", v1, m(9), "skipped", "coalesced")
        add_period(conn, "alpha", v1, m(10), "emitted", "backfill", job=("available", 0), lag=3600)
        # changed at 10:30 to every 2 minutes
        v2 = add_version(conn, spec("alpha", 120), "alpha", m(10) + timedelta(seconds=30))
        add_period(conn, "alpha", v2, m(12), "emitted", job=("running", 1))
        # m(14): missing under the new version; m(11), m(13) are no periods of it
        add_period(conn, "alpha", v2, m(16), "emitted", job=("succeeded", 2))
        vb = add_version(conn, spec("beta", 60, owner="team-b"), "beta", base)
        for n in range(1, 17):
            add_period(conn, "beta", vb, m(n), "emitted",
                       job=("dead" if n == 7 else "succeeded", 1))
        add_version(conn, spec("gamma", 60, grace=3600), "gamma", now - timedelta(minutes=5))
    return {"base": base, "m": m, "now": now}


def history(database_url, schema, *args):
    result = CliRunner().invoke(
        cli, ["history", "--database-url", database_url, "--schema", schema, *args])
    return result


def iso(t) -> str:
    return t.astimezone().isoformat()


def test_every_status_and_the_version_in_force(database_url, schema, seeded):
    m = seeded["m"]
    r = history(database_url, schema, "alpha", "--since", iso(m(0)), "--until", iso(m(16)),
                "--format", "json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    rows = doc["periods"]
    assert set(rows[0]) == {"schedule", "scheduled_for", "status", "reason", "emitted_at",
                            "lag_seconds", "job_state", "attempts"}
    got = [(x["scheduled_for"][11:16], x["status"], x["reason"], x["job_state"]) for x in rows]
    h = m(0).strftime("%H")
    assert got == [
        (f"{h}:01", "emitted", None, "succeeded"),
        (f"{h}:02", "skipped", "overlap", None),
        (f"{h}:03", "missing", None, None),
        (f"{h}:04", "emitted", None, "dead"),
        (f"{h}:05", "skipped", "paused", None),
        (f"{h}:06", "skipped", "paused", None),
        (f"{h}:07", "skipped", "paused", None),
        (f"{h}:08", "skipped", "misfire", None),
        (f"{h}:09", "skipped", "coalesced", None),
        (f"{h}:10", "emitted", "backfill", "available"),
        (f"{h}:12", "emitted", None, "running"),
        (f"{h}:14", "missing", None, None),
        (f"{h}:16", "emitted", None, "succeeded"),
    ]
    assert rows[0]["lag_seconds"] == 0.5 and rows[0]["attempts"] == 1
    assert rows[0]["emitted_at"].endswith(".500Z")
    assert rows[9]["lag_seconds"] == 3600.0
    assert doc["summary"] == [{"schedule": "alpha", "owner": "team-a", "emitted": 5,
                               "skipped": 6, "pending": 0, "missing": 2, "dead": 1}]
    assert "2 period(s) missing" in r.stderr


def test_exit_codes(database_url, schema, seeded):
    m = seeded["m"]
    window = ["--since", iso(m(0)), "--until", iso(m(16))]
    assert history(database_url, schema, "beta", *window).exit_code == 0
    dead = history(database_url, schema, "beta", *window, "--fail-on", "dead")
    assert dead.exit_code == 1 and "dead" in dead.stderr
    assert history(database_url, schema, *window).exit_code == 1  # alpha's missing periods
    pending = history(database_url, schema, "gamma", "--since", "1h", "--format", "json")
    assert pending.exit_code == 0, pending.output
    statuses = {x["status"] for x in json.loads(pending.stdout)["periods"]}
    assert statuses == {"pending"}


def test_all_schedules_in_the_window_and_summary(database_url, schema, seeded):
    m = seeded["m"]
    r = history(database_url, schema, "--since", iso(m(0)), "--until", iso(m(16)),
                "--format", "json")
    doc = json.loads(r.stdout)
    assert [s["schedule"] for s in doc["summary"]] == ["alpha", "beta"]  # gamma came later
    beta = doc["summary"][1]
    assert (beta["emitted"], beta["missing"], beta["dead"], beta["owner"]) == (16, 0, 1, "team-b")


def test_table_fits_80_columns(database_url, schema, seeded):
    m = seeded["m"]
    r = history(database_url, schema, "--since", iso(m(0)), "--until", iso(m(16)))
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any("missing" in line for line in lines)
    assert any(line.startswith("alpha") for line in lines)
    assert any("EMIT" in line and "MISS" in line for line in lines)


def test_usage_errors(database_url, schema, seeded):
    unknown = history(database_url, schema, "nope")
    assert unknown.exit_code == 2 and "nope" in unknown.stderr
    bad = history(database_url, schema, "--since", "yesterday")
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    naive = history(database_url, schema, "--since", "2026-01-01T00:00:00")
    assert naive.exit_code == 2 and "offset" in naive.stderr


def test_window_past_retention_says_so(database_url, schema, seeded):
    r = history(database_url, schema, "beta", "--since", "500d", "--format", "json")
    doc = json.loads(r.stdout)
    assert doc["notes"] and "retention horizon" in doc["notes"][0]
    table = history(database_url, schema, "beta", "--since", "500d")
    assert "note: the window starts before the retention horizon" in table.stdout


@pytest.mark.parametrize("days,zone", [(400.0, "America/New_York"), (399.5, "UTC")])
def test_pruning_removes_exactly_what_the_audit_no_longer_looks_at(database_url, schema, engine,
                                                                   days, zone):
    """The audit starts at now - days (exact seconds); prune must cut periods there too, in
    whatever time zone the leader's session has (calendar days across a DST change are an hour
    off) and for a fraction of a day: a period pruned inside the audited window is "missing"."""
    from cronkeeper.db.prune import prune

    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
        horizon = (now - timedelta(days=days)).replace(microsecond=0)
        v = add_version(conn, spec("old", 60), "old", horizon - timedelta(minutes=31))
        add_version(conn, None, "old", horizon + timedelta(minutes=31))
        first = horizon - timedelta(minutes=30, seconds=horizon.second)
        for n in range(62):  # every minute the version implies, each decided when due
            add_period(conn, "old", v, first + timedelta(minutes=n), "emitted", lag=0.5)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"SET LOCAL TimeZone = '{zone}'")
        prune(conn.connection.driver_connection, jobs_days=14, periods_days=days, batch=1000)
        kept = conn.execute(sa.text("SELECT min(scheduled_for), count(*) FROM periods")).one()
    # a minute's slack either side: the clock moved between the reads
    assert horizon - timedelta(minutes=1) <= kept[0] <= horizon + timedelta(minutes=1), kept
    r = history(database_url, schema, "old", "--since", "500d", "--retention-days", str(days),
                "--format", "json")
    summary = json.loads(r.stdout)["summary"][0]
    assert (summary["missing"], r.exit_code) == (0, 0), summary
    assert summary["emitted"] >= 29


def test_a_horizon_past_what_the_leader_keeps_is_refused(database_url, schema, monkeypatch):
    """The leader prunes period outcomes at 400 days whatever history is told; a longer
    ``--retention-days`` (or its environment variable, which the daemon never read) made
    history report the pruned periods as missing. Refused, naming the range."""
    r = history(database_url, schema, "--since", "700d", "--retention-days", "800")
    assert r.exit_code == 2 and "1<=x<=400" in r.output, r.output
    monkeypatch.setenv("CRONKEEPER_RETENTION_PERIODS_DAYS", "800")
    assert history(database_url, schema, "--since", "700d").exit_code == 2
    monkeypatch.setenv("CRONKEEPER_RETENTION_PERIODS_DAYS", "30")  # nearer: as before
    assert history(database_url, schema, "--since", "700d").exit_code == 0
