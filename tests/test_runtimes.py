"""Timeouts matched to the work (SPEC §8, issue 27): real workers run real command schedules, and
`status`, `explain`, the web pages and the metrics show each schedule's p99 run time beside its
timeout, and say so when it comes too close. The alert fires and resolves in
prometheus/cronkeeper-rules.test.yml (tests/test_rules.py runs it)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from handlers_for_tests import q, spawn_worker, wait_until
from test_metrics_worker import _free_port, _scrape

from cronkeeper.cli.main import cli
from cronkeeper.runtimes import Runtime, advice, figures, seconds

KEY = "backup@2026-03-08T07:00:00Z"  # the job command_schedule emits


def run(database_url: str, schema: str, *args: str) -> str:
    r = CliRunner().invoke(cli, [args[0], "--database-url", database_url, "--schema", schema,
                                 *args[1:]], env={"CRONKEEPER_SCHEDULES": None})
    assert r.exit_code == 0, r.output
    return r.stdout


def status_doc(database_url: str, schema: str, *args: str) -> dict:
    return json.loads(run(database_url, schema, "status", "--format", "json", *args))


def backup_item(doc: dict) -> dict:
    (item,) = [s for s in doc["schedules"] if s["name"] == "backup"]
    return item


def near_lines(doc: dict) -> list[str]:
    return [d for d in doc["diagnosis"] if d.startswith("runtime near timeout")]


@pytest.fixture
def worker(database_url, schema):
    """``start(schedules_dir)``: a real worker running the command schedule, serving metrics;
    returns its metrics port. Killed afterwards."""
    procs = []

    def start(directory: str) -> int:
        port = _free_port()
        procs.append(spawn_worker(database_url, schema, "--schedules", directory,
                                  "--metrics-address", f"127.0.0.1:{port}"))
        return port

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(10)


def finished(engine, job: int, state: str) -> bool:
    return q(engine, "SELECT state FROM outbox WHERE id = %(i)s", i=job)[0][0] == state


def test_run_time_close_to_the_timeout_is_flagged_with_file_and_line(
        engine, schema, database_url, command_schedule, worker):
    directory, job = command_schedule(["/bin/sleep", "0.9"], timeout="1s")
    port = worker(directory)
    wait_until(lambda: finished(engine, job, "succeeded"), 30, message="the 0.9 s job succeeded")
    ((outcome, took),) = q(engine, "SELECT outcome, extract(epoch FROM finished_at - started_at)"
                                   "::float8 FROM attempts WHERE job_id = %(i)s", i=job)
    assert outcome == "succeeded" and took >= 0.9

    doc = status_doc(database_url, schema, "--schedules", directory)
    item = backup_item(doc)
    assert item["timeout_seconds"] == 1.0
    assert item["duration_attempts"] == 1
    assert item["duration_p50_seconds"] == item["duration_p99_seconds"] == round(took, 3)
    assert item["attempts_timed_out_24h"] == 0 and item["near_timeout"] is True
    (line,) = near_lines(doc)
    assert "backup (owner team-test)" in line
    assert f"p99 run time {seconds(took)} ({took:.0%} of its timeout)" in line
    assert "timeout 1.00s" in line and "timed out" not in line
    # `timeout = "1s"` is line 6 of the fixture's backup.toml
    assert f"raise `timeout` to {seconds(Runtime('backup', 1.0, 1, took, took).suggested_timeout())}"\
        f" or more (at {directory}/backup.toml:6)" in line
    assert "split the job into shorter ones" in line

    # without the schedule files, status says where to look instead of guessing
    (line,) = near_lines(status_doc(database_url, schema))
    assert "`cronkeeper status --schedules DIR` names the file and line" in line
    text = run(database_url, schema, "status", "--schedules", directory)
    assert "runtime near timeout: backup (owner team-test)" in text and "backup.toml:6" in text
    assert f"{seconds(item['duration_p99_seconds'])}!" in text  # the table marks the p99

    # the gauges carry the same figures as status (the worker's scrape reads the database)
    values = _scrape(port)
    assert values['cronkeeper_schedule_duration_p99_seconds{owner="team-test",schedule="backup"}'] \
        == pytest.approx(item["duration_p99_seconds"], abs=0.001)
    assert values['cronkeeper_schedule_timeout_seconds{owner="team-test",schedule="backup"}'] == 1.0
    assert values['cronkeeper_schedule_attempts_timed_out_24h{owner="team-test",schedule="backup"}'] == 0

    # explain sets the attempt's run time against the timeout and the schedule's p99
    story = json.loads(run(database_url, schema, "explain", KEY, "--format", "json"))
    assert story["attempts"][0]["duration_seconds"] == round(took, 3)
    assert story["runtime"]["duration_p99_seconds"] == item["duration_p99_seconds"]
    assert story["runtime"]["timeout_seconds"] == 1.0 and story["runtime"]["near_timeout"] is True
    text = run(database_url, schema, "explain", KEY)
    ran = story["attempts"][0]["duration_seconds"]  # the text writes the rounded figure
    assert f"run time: attempt 1 ran {seconds(ran)}, {ran:.0%} of its 1.00s timeout" in text
    assert "schedule backup: p99" in text and "near its timeout" in text


def test_run_time_far_below_the_timeout_is_not_flagged(
        engine, schema, database_url, command_schedule, worker):
    directory, job = command_schedule(["/bin/sleep", "0.1"], timeout="1s")
    port = worker(directory)
    wait_until(lambda: finished(engine, job, "succeeded"), 30, message="the 0.1 s job succeeded")
    doc = status_doc(database_url, schema, "--schedules", directory)
    item = backup_item(doc)
    assert item["duration_attempts"] == 1
    assert 0.1 <= item["duration_p99_seconds"] < 0.8  # 0.8: where the diagnosis would begin
    assert item["near_timeout"] is False and item["attempts_timed_out_24h"] == 0
    assert near_lines(doc) == []
    assert _scrape(port)[
        'cronkeeper_schedule_duration_p99_seconds{owner="team-test",schedule="backup"}'] \
        == pytest.approx(item["duration_p99_seconds"], abs=0.001)


def test_timed_out_attempts_are_flagged_with_their_count(
        engine, schema, database_url, command_schedule, worker):
    directory, job = command_schedule(["/bin/sleep", "30"], timeout="1s", max_attempts=2)
    port = worker(directory)
    wait_until(lambda: finished(engine, job, "dead"), 60, message="both attempts timed out")
    assert [r[0] for r in q(engine, "SELECT outcome FROM attempts WHERE job_id = %(i)s "
                                    "ORDER BY attempt", i=job)] == ["timeout", "timeout"]
    doc = status_doc(database_url, schema, "--schedules", directory)
    item = backup_item(doc)
    # a timed-out attempt counts at its timeout, whatever the kill took
    assert item["duration_p50_seconds"] == item["duration_p99_seconds"] == 1.0
    assert item["duration_attempts"] == 2 and item["attempts_timed_out_24h"] == 2
    assert item["near_timeout"] is True
    (line,) = near_lines(doc)
    assert "2 attempts timed out in the last 24 h" in line
    assert "p99 run time 1.00s (100% of its timeout)" in line
    assert f"raise `timeout` to 2.00s or more (at {directory}/backup.toml:6)" in line
    assert "retried from the start" in line
    values = _scrape(port)
    assert values['cronkeeper_schedule_attempts_timed_out_24h{owner="team-test",schedule="backup"}'] == 2
    assert values['cronkeeper_schedule_duration_p99_seconds{owner="team-test",schedule="backup"}'] == 1.0

    # the web: a mark on the schedules page, the figures on the schedule's page
    from cronkeeper.db.engine import make_engine, normalize_url, redact
    from cronkeeper.web.app import Context, wsgi
    from cronkeeper.web.pages import VersionsCache
    from cronkeeper.web.security import WebConfig

    web_engine = make_engine(normalize_url(database_url), schema)
    try:
        client = wsgi(Context(web_engine, schema, "default", redact(normalize_url(database_url)),
                              WebConfig.make("127.0.0.1", 9480, None, False),
                              VersionsCache())).test_client()
        page = client.get("/", headers={"Host": "127.0.0.1"}).get_data(as_text=True)
        assert 'class="badge bad near-timeout"' in page
        detail = client.get("/schedules/backup", headers={"Host": "127.0.0.1"}).get_data(
            as_text=True)
        assert 'data-near-timeout="true"' in detail
        assert "p99 1.0 s" in detail and "timeout 1.0 s" in detail
        assert "2 timed out in the last 24 h" in detail
        story = client.get(f"/explain/{KEY}", headers={"Host": "127.0.0.1"}).get_data(as_text=True)
        assert 'id="runtime"' in story and " % of its 1.0 s timeout" in story
        assert "near timeout" in story
    finally:
        web_engine.dispose()


def test_schedule_without_attempts_has_figures_but_no_percentiles(
        engine, schema, database_url, command_schedule):
    directory, _ = command_schedule(["/bin/sleep", "0.1"], timeout="45s")
    item = backup_item(status_doc(database_url, schema))
    assert item["timeout_seconds"] == 45.0 and item["duration_attempts"] == 0
    assert item["duration_p50_seconds"] is None and item["duration_p99_seconds"] is None
    assert item["near_timeout"] is False


def test_a_missing_schedules_path_is_a_usage_error(database_url, schema, tmp_path):
    r = CliRunner().invoke(cli, ["status", "--database-url", database_url, "--schema", schema,
                                 "--schedules", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "does not exist" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(("runtime", "near"), [
    (Runtime("a", 1.0, 1, 0.5, 0.81), True),     # p99 above 80 % of the timeout
    (Runtime("a", 1.0, 1, 0.5, 0.8), False),     # at 80 %: not above it
    (Runtime("a", 600.0, 0), False),             # nothing finished yet: unknown, not near
    (Runtime("a", 600.0, 0, None, None, 1), True),  # a timeout in 24 h is enough
    (Runtime("a", 0.0, 3, 1.0, 1.0), False),     # no timeout to compare with
])
def test_near_is_p99_above_80_percent_or_a_timeout_in_24h(runtime, near):
    assert runtime.near is near


def test_figures_and_advice_in_words():
    r = Runtime("nightly", 7200.0, 100, 2400.0, 6900.0, 0)
    assert figures(r) == ("p99 run time 1h 55m (96% of its timeout), p50 40m over its last 100 "
                          "finished attempts, timeout 2h")
    assert advice(r, "at schedules/backups.toml:13") == (
        "raise `timeout` to 2h 23m or more (at schedules/backups.toml:13), slightly above the real "
        "p99 run time, or split the job into shorter ones that each fit")
    assert seconds(0.934) == "0.93s" and seconds(42) == "42s" and seconds(750) == "12m 30s"


def test_timeout_places_name_the_key_the_table_or_say_where_to_look(tmp_path):
    from cronkeeper.operations.status import timeout_places

    (tmp_path / "jobs.toml").write_text(
        '[with-timeout]\nevery = "1h"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.x"\n'
        'timeout = "5m"\n\n'
        '[without]\nevery = "1h"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.x"\n')
    found = timeout_places(str(tmp_path), {"with-timeout", "without", "gone"})
    assert found["with-timeout"] == f"at {tmp_path}/jobs.toml:6"
    assert found["without"] == f"add it to [without] at {tmp_path}/jobs.toml:8; it sets none"
    assert found["gone"].startswith(f"not found in {tmp_path}")
    assert "--schedules DIR" in timeout_places(None, {"x"})["x"]
