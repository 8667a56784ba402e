"""`cronkeeper status`: JSON shape, leader rules, and the diagnosis in words (§6)."""

from __future__ import annotations

import json
from datetime import timedelta

import sqlalchemy as sa
from click.testing import CliRunner

from cronkeeper.cli.main import cli
from cronkeeper.db.engine import leader_lock_key
from cronkeeper.schedule.model import Misfire, ScheduleSpec


def spec(name, every=60, owner="team-a"):
    return ScheduleSpec(name=name, every=every, timezone="UTC", misfire=Misfire.SKIP, task="t.x",
                        owner=owner)


def instance(conn, cluster, iid, digest="d1", tz="2025b", kind="scheduler", age=1):
    conn.execute(sa.text(
        "INSERT INTO instances (cluster, instance_id, kind, host, pid, version, schedules_digest, "
        "tzdata_version, role, heartbeat_at) VALUES (:c, :i, :k, 'h', 42, '0.1.0', :d, :tz, "
        ":r, clock_timestamp() - make_interval(secs => :a))"),
        {"c": cluster, "i": iid, "k": kind, "d": digest, "tz": tz,
         "r": "worker" if kind == "worker" else "standby", "a": age})


def version(conn, s, active_from):
    return conn.execute(sa.text(
        "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
        "(:n, :d, CAST(:j AS jsonb), :a, 1) RETURNING id"),
        {"n": s.name, "d": s.digest, "j": json.dumps(s.to_json()), "a": active_from}).scalar_one()


def job(conn, key, schedule, state, age=0, attempts=0):
    return conn.execute(sa.text(
        "INSERT INTO outbox (idempotency_key, schedule, task, state, attempts, run_after, owner, "
        "finished_at) VALUES (:k, :s, 't.x', :st, :a, "
        "clock_timestamp() - make_interval(secs => :age), 'team-a', "
        "CASE WHEN :st = 'dead' THEN clock_timestamp() END) RETURNING id"),
        {"k": key, "s": schedule, "st": state, "a": attempts, "age": age}).scalar_one()


def status(database_url, schema, cluster, *args):
    return CliRunner().invoke(cli, ["status", "--database-url", database_url, "--schema", schema,
                                    "--cluster", cluster, *args])


def test_healthy_cluster_json_shape(database_url, schema, cluster, engine):
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        instance(conn, cluster, "a")
        conn.execute(sa.text(
            "INSERT INTO leadership (cluster, term, instance_id, backend_pid, since, heartbeat_at)"
            " VALUES (:c, 7, 'a', 1, now(), clock_timestamp())"), {"c": cluster})
        vid = version(conn, spec("alpha"), now - timedelta(minutes=10))
        conn.execute(sa.text(
            "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, term) "
            "VALUES ('alpha', date_trunc('minute', now()), :v, 'skipped', 'paused', 1)"),
            {"v": vid})
        conn.execute(sa.text("INSERT INTO schedule_controls (schedule, paused, changed_by) "
                             "VALUES ('alpha', true, 'test')"))
        conn.execute(sa.text(
            "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, term) "
            "SELECT 'alpha', date_trunc('minute', now()) - make_interval(mins => g), :v, "
            "'skipped', 'paused', 1 FROM generate_series(1, 9) g"), {"v": vid})
    r = status(database_url, schema, cluster, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["leader"]["instance_id"] == "a" and doc["leader"]["term"] == 7
    assert set(doc["leader"]) >= {"instance_id", "term", "since"}
    assert set(doc["instances"][0]) >= {"instance_id", "host", "pid", "version",
                                        "schedules_digest", "heartbeat_at"}
    (alpha,) = doc["schedules"]
    assert set(alpha) >= {"name", "next_fire", "last_outcome", "paused"}
    assert alpha["paused"] is True
    assert alpha["last_outcome"]["outcome"] == "skipped"
    assert alpha["last_outcome"]["reason"] == "paused"
    assert alpha["next_fire"] > alpha["last_outcome"]["scheduled_for"]
    assert doc["lock_key"] == leader_lock_key(schema, cluster)
    assert doc["diagnosis"] == []
    text = status(database_url, schema, cluster)
    assert "nothing wrong found" in text.stdout
    assert str(leader_lock_key(schema, cluster)) in text.stdout


def test_diagnosis_names_every_problem(database_url, schema, cluster, engine):
    url = database_url.replace("postgres@", "postgres:s3cret-pw@")
    with engine.begin() as conn:
        now = conn.execute(sa.text("SELECT now()")).scalar_one()
        instance(conn, cluster, "a", digest="d1", tz="2025b")
        instance(conn, cluster, "b", digest="d2", tz="2024a")
        instance(conn, cluster, "gone", age=3600)  # not live: ignored
        conn.execute(sa.text(
            "INSERT INTO leadership (cluster, term, instance_id, backend_pid, since, heartbeat_at)"
            " VALUES (:c, 3, 'a', 1, now() - interval '1 hour', now() - interval '5 minutes')"),
            {"c": cluster})
        version(conn, spec("sync", every=60, owner="team-c"), now - timedelta(hours=2))
        job(conn, "old", "sync", "available", age=900, attempts=2)
        job(conn, "d1", "sync", "dead", attempts=5)
        failing = job(conn, "f", "sync", "available", age=10, attempts=1)
        conn.execute(sa.text(
            "INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at, outcome) "
            "SELECT :j, g, 'w', clock_timestamp() - interval '1 minute', "
            "clock_timestamp() - interval '30 seconds', 'retry' FROM generate_series(1, 8) g"),
            {"j": failing})
    r = status(url, schema, cluster, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["leader"] is None  # heartbeat 5 minutes stale
    assert [i["instance_id"] for i in doc["instances"]] == ["a", "b"]
    text = "\n".join(doc["diagnosis"])
    assert "no leader" in text and "has not heartbeated" in text
    assert "schedule digest disagreement" in text
    assert "tzdata disagreement" in text and "2024a" in text
    assert "retry storm" in text and "Adding workers makes this worse" in text
    assert "queue behind" in text and "sync (owner team-c)" in text
    assert "dead letters waiting: 1 of sync" in text
    assert "periods missing" in text  # no leader decided the last hour of sync
    assert "s3cret-pw" not in r.output
    table = status(url, schema, cluster)
    assert "s3cret-pw" not in table.output and "DIAGNOSIS" in table.stdout
    assert "***" in table.stdout


def test_released_leader_is_no_leader(database_url, schema, cluster, engine):
    with engine.begin() as conn:
        instance(conn, cluster, "a")
        conn.execute(sa.text(
            "INSERT INTO leadership (cluster, term, instance_id, backend_pid, since, heartbeat_at,"
            " released_at) VALUES (:c, 2, 'a', 1, now(), now(), now())"), {"c": cluster})
    doc = json.loads(status(database_url, schema, cluster, "--format", "json").stdout)
    assert doc["leader"] is None
    assert any("released leadership" in d for d in doc["diagnosis"])


def test_empty_cluster(database_url, schema, cluster):
    doc = json.loads(status(database_url, schema, cluster, "--format", "json").stdout)
    assert doc["leader"] is None and doc["instances"] == [] and doc["schedules"] == []
    assert any("no scheduler instance is running" in d for d in doc["diagnosis"])


def test_a_mixed_fleet_is_named_by_release_and_a_stopped_instance_as_stopped(
        database_url, schema, cluster, engine):
    from cronkeeper.db.instances import instances_stopped  # noqa: PLC0415

    with engine.begin() as conn:
        instance(conn, cluster, "old-a")
        instance(conn, cluster, "new-b")
        instance(conn, cluster, "gone", age=5)
        conn.execute(sa.text("UPDATE instances SET version = '0.2.0' WHERE instance_id = 'new-b'"))
        instances_stopped(conn, cluster, "gone")
    r = status(database_url, schema, cluster, "--format", "json")
    doc = json.loads(r.stdout)
    assert sorted(i["instance_id"] for i in doc["instances"]) == ["new-b", "old-a"]
    (gone,) = doc["stopped_instances"]
    assert gone["instance_id"] == "gone" and gone["kind"] == "scheduler"
    assert any("different releases (0.1.0: old-a; 0.2.0: new-b)" in d and "docs/upgrading.md" in d
               for d in doc["diagnosis"]), doc["diagnosis"]
    text = status(database_url, schema, cluster).output
    assert "VERSION" in text and "stopped at" in text
    with engine.begin() as conn:  # the row keeps its last heartbeat: 5 s ago, not a day
        role, age = conn.execute(sa.text(
            "SELECT role, extract(epoch FROM clock_timestamp() - heartbeat_at) FROM instances "
            "WHERE instance_id = 'gone'")).one()
    assert role == "stopped" and 4 < age < 60


def test_a_stop_on_the_previous_releases_schema_backdates_the_heartbeat(engine, cluster):
    """Before migration 8 the role check refuses 'stopped' (a worker of this release stopping
    before `migrate`, in a rolling upgrade): it leaves the live instances the 0.1.0 way."""
    from cronkeeper.db.instances import instances_stopped  # noqa: PLC0415

    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE instances DROP CONSTRAINT instances_role_check"))
        conn.execute(sa.text("ALTER TABLE instances ADD CONSTRAINT instances_role_check "
                             "CHECK (role IN ('leader', 'standby', 'worker', 'relay'))"))
        instance(conn, cluster, "w1", kind="worker")
        instances_stopped(conn, cluster, "w1")
        role, age = conn.execute(sa.text(
            "SELECT role, extract(epoch FROM clock_timestamp() - heartbeat_at) FROM instances "
            "WHERE instance_id = 'w1'")).one()
    assert role == "worker" and age > 80000


def test_status_runs_without_the_cyclic_collector_and_restores_it(
        database_url, schema, cluster, monkeypatch):
    """The command builds its document with the cyclic collector off (a one-shot process) and
    turns it back on after, whether it succeeded or failed (callers in-process)."""
    import gc

    import cronkeeper.cli.status as status_cli

    seen = []
    real = status_cli.gather

    def gather(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(status_cli, "gather", gather)
    before = gc.isenabled()  # other commands run in-process earlier (validate, history) may
    gc.enable()  # have left it off: they do not restore it
    try:
        doc = json.loads(status(database_url, schema, cluster, "--format", "json").stdout)
        assert doc["schema"] == schema and seen == [False] and gc.isenabled()
        failed = status(database_url, "no_such_schema_here", cluster, "--format", "json")
        assert failed.exit_code != 0 and "Traceback" not in failed.output
        assert gc.isenabled()
        gc.disable()  # off before: off after
        status(database_url, schema, cluster, "--format", "json")
        assert not gc.isenabled() and seen == [False, False]
    finally:
        (gc.enable if before else gc.disable)()
