"""Metrics on an injected registry: the leader's decisions, the worker's job events, and the
database collector's queue and fleet figures on a real, seeded database."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from cronkeeper import metrics as m
from cronkeeper.planning import Decision, Outcome, Reason
from cronkeeper.schedule.model import Misfire, ScheduleSet, ScheduleSpec

T = datetime(2026, 3, 1, 12, tzinfo=UTC)


def spec(name, owner="team-a"):
    return ScheduleSpec(name=name, every=60, timezone="UTC", misfire=Misfire.SKIP, task="t.x",
                        owner=owner)


def value(reg, name, **labels):
    return reg.get_sample_value(name, labels or None)


def test_leader_tick_and_skew():
    reg = CollectorRegistry()
    x = m.Metrics(reg)
    x.set_leader(True, 4)
    x.set_skew(-0.25)
    report = SimpleNamespace(now=T + timedelta(seconds=0.5), decisions=[
        ("a", Decision(T, Outcome.EMITTED), 1),
        ("a", Decision(T - timedelta(minutes=5), Outcome.SKIPPED, Reason.MISFIRE), None),
    ])
    x.observe_tick(report, ScheduleSet((spec("a"),)))
    assert value(reg, "cronkeeper_leader") == 1 and value(reg, "cronkeeper_leader_term") == 4
    assert value(reg, "cronkeeper_clock_skew_seconds") == -0.25
    assert value(reg, "cronkeeper_fires_total", schedule="a", owner="team-a", outcome="emitted",
                 reason="") == 1
    assert value(reg, "cronkeeper_fires_total", schedule="a", owner="team-a", outcome="skipped",
                 reason="misfire") == 1
    assert value(reg, "cronkeeper_fire_lag_seconds_sum", owner="team-a") == 0.5
    assert value(reg, "cronkeeper_fire_lag_seconds_count", owner="team-a") == 1
    x.set_leader(False, 4)
    assert value(reg, "cronkeeper_leader") == 0


def test_worker_job_events():
    reg = CollectorRegistry()
    x = m.Metrics(reg, kind="worker")
    x.job_started("a", "team-a")
    assert value(reg, "cronkeeper_jobs_running") == 1
    x.job_finished("a", "team-a", "retry", 2.0, attempt=1)
    x.job_started("a", "team-a")
    x.job_finished("a", "team-a", "succeeded", 1.0, attempt=2)
    assert value(reg, "cronkeeper_jobs_running") == 0
    assert value(reg, "cronkeeper_jobs_started_total", schedule="a", owner="team-a") == 2
    assert value(reg, "cronkeeper_job_failures_total", schedule="a", owner="team-a",
                 outcome="retry") == 1
    assert value(reg, "cronkeeper_jobs_finished_total", schedule="a", owner="team-a",
                 outcome="succeeded") == 1
    assert value(reg, "cronkeeper_job_duration_seconds_count", owner="team-a", outcome="retry") == 1
    assert value(reg, "cronkeeper_job_duration_seconds_sum", owner="team-a", outcome="retry") == 2.0
    assert value(reg, "cronkeeper_job_attempts_sum") == 2  # observed once, final
    assert value(reg, "cronkeeper_job_attempts_count") == 1


def test_histograms_stay_bounded_as_schedules_grow():
    """10,000 schedules of two owners: the histograms hold series per owner, never per schedule
    (per schedule they would be 16 series each); the counters keep the schedule."""
    reg = CollectorRegistry()
    x = m.Metrics(reg)
    specs = tuple(spec(f"s{i}", owner=f"team-{i % 2}") for i in range(10_000))
    report = SimpleNamespace(now=T + timedelta(seconds=0.25), decisions=[
        (f"s{i}", Decision(T, Outcome.EMITTED), i) for i in range(10_000)])
    x.observe_tick(report, ScheduleSet(specs))
    families = {f.name: f for f in reg.collect()}
    lag = [s for s in families["cronkeeper_fire_lag_seconds"].samples]
    assert {s.labels.get("owner") for s in lag} == {"team-0", "team-1"}
    assert len(lag) == 2 * (len(m.LAG_BUCKETS) + 1 + 3)  # buckets, +Inf, count, sum, created
    assert value(reg, "cronkeeper_fire_lag_seconds_count", owner="team-1") == 5_000
    fires = [s for s in families["cronkeeper_fires"].samples if s.name.endswith("_total")]
    assert len(fires) == 10_000


def test_null_metrics_when_not_serving():
    assert isinstance(m.current(), m.Metrics)
    m.NullMetrics().job_finished("a", None, "dead", 1.0, 3)  # does nothing, raises nothing


def test_database_collector(engine, cluster):
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        vid = conn.execute(sa.text(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('a', 'd', CAST(:j AS jsonb), :t, 1) RETURNING id"),
            {"j": json.dumps(spec("a").to_json()), "t": now - timedelta(minutes=30)}).scalar_one()
        conn.execute(sa.text(
            "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, term) SELECT 'a', "
            "date_trunc('minute', now()) - make_interval(mins => g), :v, 'emitted', 1 "
            "FROM generate_series(0, 20) g WHERE g <> 7"), {"v": vid})
        for key, state, age, attempts in (("k1", "available", 120, 0), ("k2", "available", 30, 2),
                                          ("k3", "dead", 0, 5), ("k4", "succeeded", 0, 1)):
            conn.execute(sa.text(
                "INSERT INTO outbox (idempotency_key, schedule, task, state, attempts, run_after, "
                "owner) VALUES (:k, 'a', 't.x', :s, :n, now() - make_interval(secs => :age), "
                "'team-a')"), {"k": key, "s": state, "age": age, "n": attempts})
        conn.execute(sa.text(
            "INSERT INTO instances (cluster, instance_id, kind, host, pid, version, "
            "schedules_digest, tzdata_version) VALUES (:c, 'x', 'scheduler', 'h', 1, 'v', 'd1', "
            "'2025b'), (:c, 'y', 'scheduler', 'h', 2, 'v', 'd2', '2025b')"), {"c": cluster})
    reg = CollectorRegistry()
    reg.register(col := m.DatabaseCollector(engine, cluster))
    assert value(reg, "cronkeeper_database_up") == 1
    assert value(reg, "cronkeeper_outbox_jobs", state="available") == 2
    assert value(reg, "cronkeeper_outbox_jobs", state="dead") == 1
    assert value(reg, "cronkeeper_outbox_jobs", state="running") == 0
    age = value(reg, "cronkeeper_outbox_oldest_available_age_seconds", schedule="a",
                owner="team-a")
    assert 119 <= age < 180
    assert value(reg, "cronkeeper_outbox_retrying_jobs", schedule="a", owner="team-a") == 1
    assert value(reg, "cronkeeper_dead_letters", schedule="a", owner="team-a") == 1
    assert value(reg, "cronkeeper_schedule_digests", kind="scheduler") == 2
    assert value(reg, "cronkeeper_tzdata_versions") == 1
    assert value(reg, "cronkeeper_instances", kind="scheduler") == 2
    # the audit runs beside the scrape, never in it: unknown (absent) until it has finished
    assert col.audited.wait(timeout=60)
    assert value(reg, "cronkeeper_periods_missing", schedule="a", owner="team-a") >= 1
    last = value(reg, "cronkeeper_schedule_last_fire_timestamp_seconds", schedule="a",
                 owner="team-a")
    nxt = value(reg, "cronkeeper_schedule_next_fire_timestamp_seconds", schedule="a",
                owner="team-a")
    assert nxt - last == 60


def test_collector_survives_a_missing_database():
    bad = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none",
                           connect_args={"connect_timeout": 1})
    reg = CollectorRegistry()
    reg.register(m.DatabaseCollector(bad, "c"))
    assert value(reg, "cronkeeper_database_up") == 0


def test_a_missing_database_is_said_once_not_per_scrape(caplog):
    bad = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none",
                           connect_args={"connect_timeout": 1})
    reg = CollectorRegistry()
    reg.register(m.DatabaseCollector(bad, "c"))
    with caplog.at_level("WARNING", logger="cronkeeper"):
        for _ in range(3):
            assert value(reg, "cronkeeper_database_up") == 0
    said = [r for r in caplog.records if getattr(r, "action", None) == "metrics_db_unavailable"]
    assert len(said) == 1, [r.getMessage() for r in said]


def test_a_slow_audit_never_holds_a_scrape(engine, cluster):
    """The audit of the last hour runs beside the scrape: while it is still running, scrapes
    answer at once, without the missing counts (unknown, not 0), and only one audit runs."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('a', 'd', CAST(:j AS jsonb), now() - interval '10 minutes', 1)"),
            {"j": json.dumps(spec("a").to_json())})
    release = threading.Event()
    started = []

    class Slow(m.DatabaseCollector):
        def _audit(self):
            started.append(1)
            release.wait(60)
            super()._audit()

    reg = CollectorRegistry()
    reg.register(col := Slow(engine, cluster))
    for _ in range(3):
        assert value(reg, "cronkeeper_database_up") == 1
        assert value(reg, "cronkeeper_periods_missing", schedule="a", owner="team-a") is None
    assert len(started) == 1
    release.set()
    assert col.audited.wait(timeout=60)
    assert value(reg, "cronkeeper_periods_missing", schedule="a", owner="team-a") >= 9


def test_an_unreadable_version_costs_only_its_own_schedule(engine, cluster, caplog):
    """A schedule_versions row someone else wrote that cannot be read: that schedule has no
    next fire and no audit (warned once); every other schedule's figures are still there."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('a', 'd', CAST(:j AS jsonb), now() - interval '10 minutes', 1), "
            "('b', 'd', '{\"every\": \"soon\"}', now() - interval '10 minutes', 1)"),
            {"j": json.dumps(spec("a").to_json())})
    reg = CollectorRegistry()
    reg.register(col := m.DatabaseCollector(engine, cluster))
    names = {s.labels.get("schedule") for f in reg.collect() for s in f.samples
             if f.name == "cronkeeper_schedule_next_fire_timestamp_seconds"}
    assert names == {"a"}
    assert col.audited.wait(timeout=60)
    assert value(reg, "cronkeeper_periods_missing", schedule="a", owner="team-a") >= 9
    assert value(reg, "cronkeeper_periods_missing", schedule="b", owner="") is None
    warned = [r.getMessage() for r in caplog.records if "'b'" in r.getMessage()]
    assert len(warned) == 1 and "stored version" in warned[0], warned
