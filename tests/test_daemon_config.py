"""Schedule files at start and on SIGHUP (SPEC §6): a broken set at start stops the daemon with
every error; a broken set on reload is refused and the last good set keeps firing; a valid
changed set takes effect from now on, with a new version row per changed or new schedule."""

from __future__ import annotations

import signal
import subprocess

from daemon_harness import (
    CRONKEEPER,
    Fleet,
    assert_audit_clean,
    audit,
    db_now,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)

BROKEN = """\
[a]
cron = "* * * * * *"
misfire = "sometimes"
ownr = "me"
task = "t.a"

[b]
every = "0s"
timezone = "Mars/Base"
misfire = "skip"
task = "t.b"
"""


def test_broken_schedules_dir_at_start_exits_nonzero_with_every_error(tmp_path):
    pg = shared_postgres()
    schedules = write_schedules(tmp_path / "schedules", {"broken.toml": BROKEN})
    result = subprocess.run(
        [CRONKEEPER, "run", "--database-url", pg.url, "--schema", pg.new_schema(),
         "--schedules", str(schedules), "--metrics-address", "off"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    err = result.stderr
    path = str(schedules / "broken.toml")
    for line, words in [(1, "timezone"), (3, "misfire"), (4, "did you mean 'owner'"),
                        (8, "every"), (9, "Mars/Base")]:
        assert f"{path}:{line}:" in err and words in err, (line, words, err)
    assert "Traceback" not in err


def test_missing_schedules_dir_at_start_exits_nonzero(tmp_path):
    pg = shared_postgres()
    result = subprocess.run(
        [CRONKEEPER, "run", "--database-url", pg.url, "--schema", pg.new_schema(),
         "--schedules", str(tmp_path / "nowhere"), "--metrics-address", "off"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "nowhere" in result.stderr and "Traceback" not in result.stderr


def _periods_after(db, schedule: str, after) -> int:
    return db.execute("SELECT count(*) FROM periods WHERE schedule = %s AND scheduled_for > %s",
                      (schedule, after)).fetchone()[0]


def test_sighup_broken_set_keeps_old_set_valid_set_takes_effect(tmp_path):
    pg = shared_postgres()
    good = {"a.toml": schedule_toml("a", cron="* * * * * *")}
    schedules = write_schedules(tmp_path / "schedules", good)
    fleet = Fleet(pg, pg.new_schema(), schedules, tmp_path, n=1, leader_timeout=3)
    daemon = fleet.daemons[0]
    db = set_path(pg.connect(), fleet.schema)
    try:
        fleet.start()
        wait_for(lambda: _periods_after(db, "a", "-infinity") >= 2, 20, "a to fire")
        versions = db.execute("SELECT count(*) FROM schedule_versions").fetchone()[0]

        # a broken set: refused with its errors logged, and `a` keeps firing
        write_schedules(schedules, {"a.toml": BROKEN})
        daemon.signal(signal.SIGHUP)
        refused = daemon.wait_log(lambda r: r.get("action") == "reload_refused", 10,
                                  "the broken set to be refused")
        messages = " ".join(r.get("message", "") for r in daemon.records()
                            if r.get("action") == "reload_refused")
        assert "misfire" in messages and "did you mean 'owner'" in messages, refused
        since = db_now(db)
        wait_for(lambda: _periods_after(db, "a", since) >= 2, 10, "a to keep firing")
        assert daemon.alive()
        assert db.execute("SELECT count(*) FROM schedule_versions").fetchone()[0] == versions

        # a valid changed set: `a` every 2 s from now on, `b` new, `c` never seen
        write_schedules(schedules, {
            "a.toml": schedule_toml("a", every="2s"),
            "b.toml": schedule_toml("b", cron="* * * * * *"),
        })
        daemon.signal(signal.SIGHUP)
        daemon.wait_log(lambda r: r.get("action") == "schedule_changed" and r.get("schedule") == "a",
                        10, "a to change")
        daemon.wait_log(lambda r: r.get("action") == "schedule_new" and r.get("schedule") == "b",
                        10, "b to be added")
        rows = db.execute(
            "SELECT schedule, spec->>'every', active_from FROM schedule_versions "
            "ORDER BY active_from, schedule").fetchall()
        assert len(rows) == versions + 2
        changed = {r[0]: r for r in rows[versions:]}
        assert set(changed) == {"a", "b"} and changed["a"][1] == "2.0"
        active_from = changed["a"][2]
        wait_for(lambda: _periods_after(db, "a", active_from) >= 2
                 and _periods_after(db, "b", active_from) >= 2, 10, "the new set to fire")
        odd = db.execute(
            "SELECT scheduled_for FROM periods WHERE schedule = 'a' AND scheduled_for > %s "
            "AND extract(epoch FROM scheduled_for)::bigint %% 2 <> 0", (active_from,)).fetchall()
        assert odd == [], "a fired by its old spec after the change"

        # removing b stops it; a's periods stay decided by the version in force at each
        write_schedules(schedules, {"a.toml": schedule_toml("a", every="2s")})
        daemon.signal(signal.SIGHUP)
        daemon.wait_log(lambda r: r.get("action") == "schedule_removed" and r.get("schedule") == "b",
                        10, "b to be removed")
        removed_at = db.execute("SELECT active_from FROM schedule_versions WHERE schedule = 'b' "
                                "AND spec IS NULL").fetchone()[0]
        wait_for(lambda: _periods_after(db, "a", removed_at) >= 1, 10, "a to keep firing")
        assert _periods_after(db, "b", removed_at) == 0
        wait_for(lambda: not audit(db, margin=1.5).missing, 10, "every due period decided")
        assert_audit_clean(db, margin=1.5, context="after reloads")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{fleet.logs()}") from None
    finally:
        fleet.shutdown()
        db.close()


def test_a_daemon_stopped_by_sigterm_is_recorded_as_stopped_not_stale(tmp_path):
    """A graceful stop says so (role 'stopped', its last heartbeat kept), so status and the web
    show it as stopped, not as a leader whose heartbeat is a day old."""
    pg = shared_postgres()
    schedules = write_schedules(tmp_path / "schedules",
                                {"a.toml": schedule_toml("a", cron="* * * * * *")})
    fleet = Fleet(pg, pg.new_schema(), schedules, tmp_path, n=1, leader_timeout=3)
    daemon = fleet.daemons[0]
    db = set_path(pg.connect(), fleet.schema)
    try:
        fleet.start()
        wait_for(lambda: _periods_after(db, "a", "-infinity") >= 1, 20, "a to fire")
        wait_for(lambda: db.execute("SELECT count(*) FROM instances WHERE cluster = %s AND "
                                    "role = 'leader'", (fleet.cluster,)).fetchone()[0], 20,
                 "its instances row")
        assert daemon.stop() == 0
        role, age = db.execute(
            "SELECT role, extract(epoch FROM clock_timestamp() - heartbeat_at) FROM instances "
            "WHERE cluster = %s AND instance_id = %s", (fleet.cluster, daemon.instance_id)).fetchone()
        assert role == "stopped" and age < 30, (role, age)
        out = subprocess.run(
            [CRONKEEPER, "status", "--database-url", pg.url, "--schema", fleet.schema,
             "--cluster", fleet.cluster, "--format", "json"], capture_output=True, text=True,
            timeout=60)
        import json  # noqa: PLC0415

        doc = json.loads(out.stdout)
        assert doc["instances"] == [] and doc["leader"] is None
        assert [i["instance_id"] for i in doc["stopped_instances"]] == [daemon.instance_id]
        # Started again under the same id, it is live again.
        daemon.start()
        daemon.wait_log(lambda r: r.get("action") == "ready", 20, "ready again")
        wait_for(lambda: db.execute(
            "SELECT count(*) FROM instances WHERE cluster = %s AND instance_id = %s AND "
            "role <> 'stopped'", (fleet.cluster, daemon.instance_id)).fetchone()[0], 20,
            "the row live again")
    finally:
        fleet.shutdown()
        db.close()
