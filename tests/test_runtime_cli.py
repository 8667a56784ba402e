"""`cronkeeper schedules list|show|put|delete`, `next NAME` from the database, and every place a
file schedule shows (status, the web's pages, the metrics, pause, trigger, backfill, explain,
history), for a runtime schedule (SPEC §15), against a real database, through the CLI."""

from __future__ import annotations

import json
from datetime import timedelta

import psycopg
import pytest
from click.testing import CliRunner
from daemon_harness import wait_for
from prometheus_client import CollectorRegistry

from cronkeeper import metrics as m
from cronkeeper import schedules
from cronkeeper.cli.main import cli
from cronkeeper.db.schedule_versions import versions_insert
from cronkeeper.db.sessions import db_now
from cronkeeper.web import pages

SPEC = {"every": "10m", "timezone": "UTC", "misfire": "skip", "task": "t.report",
        "owner": "team-r"}


@pytest.fixture
def raw(database_url, schema):
    with psycopg.connect(database_url, autocommit=True, options=f"-c search_path={schema}") as conn:
        yield conn


def invoke(database_url, schema, *args):
    result = CliRunner().invoke(cli, [*args, "--database-url", database_url, "--schema", schema])
    assert "Traceback" not in result.output
    return result


def adopt(raw, name: str, ago: timedelta = timedelta(hours=1)) -> int:
    """Record the runtime schedule's version as a leader adopting it would (an hour ago)."""
    version_id, canonical, digest = raw.execute(
        "SELECT version_id, canonical, digest FROM runtime_schedules WHERE name = %s",
        (name,)).fetchone()
    versions_insert(raw, [(name, digest, canonical)], db_now(raw) - ago, 1,
                    origins=["runtime"], ids=[version_id])
    return version_id


def test_schedules_put_from_a_file_with_and_without_its_header(database_url, schema, raw, tmp_path):
    headed = tmp_path / "headed.toml"
    headed.write_text('[tenant-7]\nevery = "10m"\ntimezone = "UTC"\nmisfire = "skip"\n'
                      'task = "t.report"\nowner = "team-r"\n')
    bare = tmp_path / "bare.toml"
    bare.write_text('every = "10m"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.report"\n'
                    'owner = "team-r"\n')
    out = invoke(database_url, schema, "schedules", "put", "tenant-7", "--from", str(headed))
    assert out.exit_code == 0, out.output
    assert "written, version" in out.output
    again = invoke(database_url, schema, "schedules", "put", "tenant-7", "--from", str(bare))
    assert again.exit_code == 0 and "unchanged" in again.output, again.output
    listed = invoke(database_url, schema, "schedules", "list", "--format", "json")
    doc = json.loads(listed.output)
    assert [(i["name"], i["source"], i["spec"], i["paused"]) for i in doc] == [
        ("tenant-7", "runtime", SPEC, False)]
    assert set(doc[0]) == {"name", "source", "version_id", "spec", "updated_at", "paused"}
    shown = invoke(database_url, schema, "schedules", "show", "tenant-7")
    assert shown.exit_code == 0 and "tenant-7': runtime" in shown.output


def test_schedules_put_reports_every_problem_with_file_and_line(database_url, schema, raw, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[x]\nevery = "10m"\ntimezone = "Mars/Base"\nmisfire = "skip"\n'
                   'task = "t"\ncomand = ["a"]\n')
    out = invoke(database_url, schema, "schedules", "put", "x", "--from", str(bad))
    assert out.exit_code == 1
    assert f"{bad}:3: schedule 'x':" in out.output
    assert f"{bad}:6: schedule 'x': unknown key 'comand'; did you mean 'command'?" in out.output
    assert raw.execute("SELECT count(*) FROM runtime_schedules").fetchone()[0] == 0
    broken = tmp_path / "broken.toml"
    broken.write_text("[x\n")
    out = invoke(database_url, schema, "schedules", "put", "x", "--from", str(broken))
    assert out.exit_code == 1 and "invalid TOML" in out.output


def test_schedules_put_names_a_header_that_is_not_the_schedules(database_url, schema, raw,
                                                                 tmp_path):
    """A file whose one table is another schedule's ([tenant-8] for `put tenant-7`) was told
    "unknown key 'tenant-8' (a table) ... quote it: ["tenant-7.tenant-8"]" and four more
    problems it does not have; two tables, the same about each."""
    table = 'every = "10m"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.report"\n'
    other, two = tmp_path / "other.toml", tmp_path / "two.toml"
    other.write_text(f"[tenant-8]\n{table}")
    two.write_text(f"[tenant-7]\n{table}\n[tenant-8]\n{table}")
    for path, said in ((other, ":1: the file's table is [tenant-8], not [tenant-7]: name the "
                                "header [tenant-7], or remove it"),
                       (two, ": the file holds 2 tables ([tenant-7], [tenant-8]); `schedules "
                             "put` takes one schedule's")):
        out = invoke(database_url, schema, "schedules", "put", "tenant-7", "--from", str(path))
        assert (out.exit_code, out.output) == (1, f"error: {path}{said}\n")
    assert raw.execute("SELECT count(*) FROM runtime_schedules").fetchone()[0] == 0


def test_schedules_delete_and_its_refusals(database_url, schema, raw):
    with psycopg.connect(database_url) as conn:
        schedules.put(conn, "gone", SPEC, schema=schema)
        conn.commit()
    versions_insert(raw, [("nightly", "d", {"task": "t"})], db_now(raw), 1,
                    origins=["file:/srv/schedules/billing.toml"])
    assert invoke(database_url, schema, "schedules", "delete", "gone").exit_code == 0
    again = invoke(database_url, schema, "schedules", "delete", "gone")
    assert again.exit_code == 1 and "no runtime schedule named 'gone'" in again.output
    file_one = invoke(database_url, schema, "schedules", "delete", "nightly")
    assert file_one.exit_code == 1 and "/srv/schedules/billing.toml" in file_one.output
    listed = json.loads(invoke(database_url, schema, "schedules", "list", "--source", "file",
                               "--format", "json").output)
    assert [(i["name"], i["source"]) for i in listed] == [("nightly", "file")]


def test_next_reads_a_runtime_schedule_from_the_database(database_url, schema, raw):
    with psycopg.connect(database_url) as conn:
        schedules.put(conn, "hourly", {"cron": "0 * * * *", "timezone": "Europe/Berlin",
                                       "misfire": "skip", "task": "t"}, schema=schema)
        conn.commit()
    out = invoke(database_url, schema, "next", "hourly", "--after", "2026-03-29T00:30:00Z", "-n",
                 "3", "--format", "json")
    assert out.exit_code == 0, out.output
    assert [f["utc"] for f in json.loads(out.output)["fires"]] == [
        "2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z", "2026-03-29T03:00:00Z"]
    missing = invoke(database_url, schema, "next", "nope")
    assert missing.exit_code == 1 and "no schedule named 'nope'" in missing.output


def test_a_runtime_schedule_shows_wherever_a_file_schedule_does(database_url, schema, raw, engine,
                                                               cluster):
    with psycopg.connect(database_url) as conn:
        schedules.put(conn, "rt", SPEC, schema=schema)
        conn.commit()
    version = adopt(raw, "rt")
    versions_insert(raw, [("filed", "d", {"name": "filed", "every": 600.0, "timezone": "UTC",
                                         "misfire": "skip", "task": "t"})],
                    db_now(raw) - timedelta(hours=1), 1, origins=["file:/x.toml"])
    status = json.loads(invoke(database_url, schema, "status", "--cluster", cluster,
                               "--format", "json").output)
    assert {s["name"]: s["source"] for s in status["schedules"]} == {"rt": "runtime",
                                                                     "filed": "file"}
    assert invoke(database_url, schema, "pause", "rt").exit_code == 0
    listed = json.loads(invoke(database_url, schema, "schedules", "list", "--format", "json").output)
    assert {(i["name"], i["source"], i["paused"]) for i in listed} == {
        ("rt", "runtime", True), ("filed", "file", False)}
    assert invoke(database_url, schema, "resume", "rt").exit_code == 0
    trig = invoke(database_url, schema, "trigger", "rt")
    assert trig.exit_code == 0, trig.output
    start = (db_now(raw) - timedelta(minutes=50)).isoformat()
    end = db_now(raw).isoformat()
    back = invoke(database_url, schema, "backfill", "rt", "--from", start, "--to", end,
                  "--format", "json")
    assert back.exit_code == 0, back.output
    assert raw.execute("SELECT count(*) FROM periods WHERE schedule = 'rt' AND version_id = %s",
                       (version,)).fetchone()[0] >= 4
    key = raw.execute("SELECT idempotency_key FROM outbox WHERE schedule = 'rt' AND scheduled_for"
                      " IS NOT NULL LIMIT 1").fetchone()[0]
    explained = invoke(database_url, schema, "explain", key)
    assert explained.exit_code == 0 and "rt" in explained.output, explained.output
    hist = invoke(database_url, schema, "history", "rt", "--since", "2h", "--format", "json")
    assert json.loads(hist.output.splitlines()[0])["summary"][0]["schedule"] == "rt"

    cache = pages.VersionsCache()
    rows = pages.schedules(engine, cache)["rows"]
    assert {r["name"]: r["source"] for r in rows} == {"rt": "runtime", "filed": "file"}
    assert pages.schedule_detail(engine, cache, "rt")["source"] == "runtime"

    reg = CollectorRegistry()
    reg.register(m.DatabaseCollector(engine, cluster))
    assert reg.get_sample_value("cronkeeper_schedule_info", {
        "schedule": "rt", "owner": "team-r", "source": "runtime"}) == 1
    assert reg.get_sample_value("cronkeeper_schedule_info", {
        "schedule": "filed", "owner": "", "source": "file"}) == 1


def test_backfill_and_trigger_emit_nothing_after_a_delete_no_leader_has_adopted(
        database_url, schema, raw):
    """SPEC §15's fence holds for an operator's claim too: a runtime schedule deleted while no
    leader runs (or before the leader looks) is not backfilled past its delete, nor triggered;
    put again, it waits for a leader to adopt the new incarnation. Before the fix backfill
    emitted the periods between the delete and now by the deleted version."""
    every_second = {"every": "1s", "timezone": "UTC", "misfire": "skip", "task": "t"}
    with psycopg.connect(database_url) as conn:
        schedules.put(conn, "gone", every_second, schema=schema)
        conn.commit()
    adopt(raw, "gone")
    with psycopg.connect(database_url) as conn:
        assert schedules.delete(conn, "gone", schema=schema)
        conn.commit()
    deleted_at = raw.execute("SELECT deleted_at FROM runtime_schedules WHERE name = 'gone'"
                             ).fetchone()[0]
    wait_for(lambda: db_now(raw) > deleted_at + timedelta(seconds=2), 30, "periods past the delete")
    window = ["--from", (deleted_at - timedelta(seconds=30)).isoformat(),
              "--to", db_now(raw).isoformat()]
    back = invoke(database_url, schema, "backfill", "gone", *window)
    assert back.exit_code == 1
    assert "'gone' was deleted at runtime at " in back.output, back.output
    trig = invoke(database_url, schema, "trigger", "gone")
    assert trig.exit_code == 1 and "deleted at runtime" in trig.output, trig.output
    assert raw.execute("SELECT count(*) FROM periods WHERE schedule = 'gone'"
                       " AND scheduled_for > %s", (deleted_at,)).fetchone()[0] == 0
    assert raw.execute("SELECT count(*) FROM outbox WHERE schedule = 'gone'").fetchone()[0] == 0

    with psycopg.connect(database_url) as conn:  # put again: another incarnation, not adopted
        schedules.put(conn, "gone", every_second, schema=schema)
        conn.commit()
    again = invoke(database_url, schema, "backfill", "gone", *window)
    assert again.exit_code == 1 and "deleted and put again" in again.output, again.output
    assert raw.execute("SELECT count(*) FROM outbox WHERE schedule = 'gone'").fetchone()[0] == 0
