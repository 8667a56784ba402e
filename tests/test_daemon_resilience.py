"""What a fresh-eyes review found the daemon must survive: an unreadable stored version, a long
backlog worked off with a short stall timeout, a backfill of a later window before a restart,
and SIGTERM in the middle of a catch-up. Real daemons on the private PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from daemon_harness import (
    Daemon,
    record_versions,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)


@pytest.fixture
def pg():
    return shared_postgres()


def _daemon(pg, schema, directory, tmp_path, **kw) -> Daemon:
    return Daemon(url=pg.url, schema=schema, cluster=f"c-{uuid.uuid4().hex[:8]}", schedules=directory,
                  instance_id=f"i-{uuid.uuid4().hex[:6]}", log_dir=tmp_path, **kw)


def _count(pg, schema, sql, *args):
    with set_path(pg.connect(), schema) as conn:
        return conn.execute(sql, args).fetchone()[0]


def test_an_unreadable_stored_version_is_skipped_and_the_rest_keep_firing(pg, tmp_path):
    schema = pg.new_schema()
    directory = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("good", cron="* * * * * *")})
    with set_path(pg.connect(), schema) as conn:  # a row written by someone else
        conn.execute("INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
                     "VALUES ('odd', 'x', '{\"name\": \"odd\"}', clock_timestamp(), 1)")
    daemon = _daemon(pg, schema, directory, tmp_path).start()
    try:
        daemon.wait_log(lambda r: r.get("action") == "version_unreadable", 20, "the bad row named")
        wait_for(lambda: _count(pg, schema, "SELECT count(*) FROM periods WHERE schedule = 'good'") >= 2,
                 20, "the good schedule fires")
        assert daemon.alive()
        assert "Traceback" not in daemon.log_text()
    finally:
        assert daemon.stop() == 0


def test_a_backlog_is_worked_off_in_one_term_despite_a_short_stall_timeout(pg, tmp_path):
    schema = pg.new_schema()
    files = {f"s{i}.toml": schedule_toml(f"s{i}", every="1s", catch_up_limit="24h") for i in range(8)}
    directory = write_schedules(tmp_path / "s", files)
    record_versions(pg, schema, directory, timedelta(hours=2))  # 8 x 7,200 periods due at start
    daemon = _daemon(pg, schema, directory, tmp_path, stall_timeout=2, leader_timeout=30).start()
    try:
        wait_for(lambda: _count(pg, schema, "SELECT count(*) FROM periods") >= 8 * 7200, 120,
                 "the backlog decided")
        assert _count(pg, schema, "SELECT count(DISTINCT term) FROM periods") == 1
        assert not any(r.get("action") == "leader_stalled" for r in daemon.records())
        # One statement, one snapshot: the daemon keeps firing (8 periods a second) meanwhile.
        assert _count(pg, schema, "SELECT (SELECT count(*) FROM outbox) - (SELECT count(*) FROM "
                                  "periods WHERE outcome = 'emitted')") == 0
    finally:
        assert daemon.stop(30) == 0


def test_a_backfilled_later_window_does_not_hide_the_periods_before_it(pg, tmp_path):
    schema = pg.new_schema()
    directory = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("ten", every="10s", catch_up_limit="24h")})
    record_versions(pg, schema, directory, timedelta(minutes=2))
    with set_path(pg.connect(), schema) as conn:  # an operator backfilled the last 20 s (term 0)
        vid = conn.execute("SELECT id FROM schedule_versions").fetchone()[0]
        conn.execute(
            "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, term) "
            "SELECT 'ten', t, %s, 'emitted', 'backfill', 0 FROM generate_series("
            " to_timestamp(floor(extract(epoch FROM clock_timestamp()) / 10) * 10) - interval '10 s',"
            " to_timestamp(floor(extract(epoch FROM clock_timestamp()) / 10) * 10), interval '10 s') t",
            (vid,),
        )
    daemon = _daemon(pg, schema, directory, tmp_path).start()
    try:
        daemon.wait_log(lambda r: r.get("action") == "leader_won", 20, "leads")
        # every period of the two minutes is decided: the leader's, or the backfill's
        wait_for(lambda: _count(pg, schema, "SELECT count(*) FROM periods") >= 12, 20,
                 "the periods before the backfilled window decided")
        assert _count(pg, schema, "SELECT count(*) FROM periods WHERE term > 0") >= 10
    finally:
        assert daemon.stop() == 0


def test_sigterm_during_a_long_catch_up_stops_promptly(pg, tmp_path):
    schema = pg.new_schema()
    files = {f"s{i}.toml": schedule_toml(f"s{i}", every="1s", catch_up_limit="24h") for i in range(20)}
    directory = write_schedules(tmp_path / "s", files)
    record_versions(pg, schema, directory, timedelta(hours=12))  # 864,000 periods: minutes of work
    daemon = _daemon(pg, schema, directory, tmp_path, leader_timeout=30, stall_timeout=30).start()
    try:
        wait_for(lambda: _count(pg, schema, "SELECT count(*) FROM periods") > 0, 60, "catch-up started")
        daemon.terminate()
        assert daemon.proc.wait(20) == 0
        assert _count(pg, schema, "SELECT count(*) FROM periods") < 20 * 43200
    finally:
        daemon.kill()
