"""Being told, with real daemons and workers (docs/notifications.md): a flood of dead letters
is one notification and the recovery carries the count; a worker killed between the
dead-lettering and the send loses nothing and is repeated at most once; an outage of every
daemon is one missed notification per schedule; heartbeat_url is pinged by the leader only,
and falls silent when every daemon stops. Receivers on loopback (tests/notify_receivers.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psycopg
from daemon_harness import (
    Daemon,
    Fleet,
    db_now,
    leader_row,
    schedule_toml,
    set_path,
    shared_postgres,
    spawn_json_worker,
    wait_for,
    wait_new_leader,
    write_schedules,
)
from notify_receivers import HttpReceiver

import cronkeeper


def notify_toml(path: Path, url: str, *, extra: str = "", timeout: str = "2s") -> Path:
    path.write_text(f"""{extra}
max_attempts = 10
retry_for = "2s"
backoff = {{ base = "0.1s", factor = 2, max = "1s" }}

[sinks.hook]
kind = "webhook"
url = "{url}"
timeout = "{timeout}"

[[rules]]
sink = "hook"
""")
    return path


def rows(db: psycopg.Connection, sql: str, *params) -> list[tuple]:
    return db.execute(sql, params).fetchall()


def flood_toml(flag: Path) -> str:
    return f"""[flood]
every = "2s"
timezone = "UTC"
misfire = "skip"
grace = "10s"
overlap = "allow"
task = "fails_while_flagged"
payload = {{ flag = "{flag}" }}
max_attempts = 1
owner = "team-flood"
"""


def test_a_flood_of_dead_letters_is_one_notification_and_the_recovery_carries_the_count(tmp_path):
    """The worker that dead-letters has no notify config; the daemon's sender tells: the
    notification does not depend on the process that wrote it."""
    pg = shared_postgres()
    schema = pg.new_schema()
    receiver = HttpReceiver()
    flag = tmp_path / "flag"
    flag.write_text("up")
    schedules = write_schedules(tmp_path / "s", {"flood.toml": flood_toml(flag)})
    config = notify_toml(tmp_path / "notify.toml", receiver.url + "/hook")
    daemon = Daemon(url=pg.url, schema=schema, cluster="flood", schedules=schedules,
                    instance_id="d1", log_dir=tmp_path,
                    extra=["--notify-config", str(config)]).start()
    worker = spawn_json_worker(pg.url, schema, "flood", "w1", tmp_path / "w1.log")
    db = set_path(pg.connect(), schema)
    try:
        def dead() -> int:
            return rows(db, "SELECT count(*) FROM outbox WHERE schedule = 'flood' AND "
                            "state = 'dead'")[0][0]

        wait_for(lambda: dead() >= 4, 60, "four dead letters of one schedule", alive=worker)
        wait_for(lambda: receiver.posts("/hook"), 20, "the dead notification")
        assert rows(db, "SELECT count(*) FROM notifications WHERE event = 'dead'")[0][0] == 1
        first = receiver.posts("/hook")[0].json()
        assert (first["event"], first["schedule"], first["owner"]) == ("dead", "flood",
                                                                       "team-flood")
        assert first["error"].startswith("PermanentError: flag") or "flag" in first["error"]
        assert "charging customer 42: card declined" in first["output_tail"]

        flag.unlink()  # fixed: the next period succeeds
        recovered = wait_for(lambda: [r.json() for r in receiver.posts("/hook")
                                      if r.json()["event"] == "recovered"], 30, "the recovery")
        assert len(recovered) == 1
        assert recovered[0]["count"] == dead() - 1 >= 3
        assert recovered[0]["window"]["from"] <= recovered[0]["window"]["until"]
        assert [r.json()["event"] for r in receiver.posts("/hook")] == ["dead", "recovered"]
    finally:
        worker.kill()
        worker.wait(10)
        daemon.stop()
        receiver.close()


def test_a_worker_killed_between_the_dead_letter_and_the_send_loses_nothing(tmp_path,
                                                                            database_url):
    pg = shared_postgres()
    schema = pg.new_schema()
    db = set_path(pg.connect(), schema)
    receiver = HttpReceiver()
    config = notify_toml(tmp_path / "notify.toml", receiver.url + "/hook", timeout="1s")
    try:
        # 1. Killed mid-send: its sink holds the request; the worker dies before recording it.
        receiver.hold.set()
        with psycopg.connect(pg.url) as app:
            app.execute(f'SET search_path TO "{schema}"')
            cronkeeper.enqueue(app, "permanent", {}, key="first", schema=schema)
        w1 = spawn_json_worker(pg.url, schema, "kill", "w1", tmp_path / "w1.log",
                               "--notify-config", str(config))
        wait_for(lambda: receiver.posts("/hook"), 30, "the send that hangs", alive=w1)
        os.kill(w1.pid, signal.SIGKILL)
        w1.wait(10)
        receiver.hold.clear()
        receiver.released.set()
        assert rows(db, "SELECT state FROM notifications") == [("sending",)]
        w2 = spawn_json_worker(pg.url, schema, "kill", "w2", tmp_path / "w2.log",
                               "--notify-config", str(config))
        wait_for(lambda: rows(db, "SELECT state FROM notifications") == [("sent",)], 40,
                 "the notification sent by the next worker once the lease ran out", alive=w2)
        hooks = receiver.posts("/hook")
        assert 1 <= len(hooks) <= 2 and len({r.json()["id"] for r in hooks}) == 1
        assert hooks[-1].json()["key"] == "first"

        # 2. Killed before it sends at all: a worker without a notify config dead-letters and
        # dies; the notification was written with the dead letter, and another sender sends it.
        w2.kill()
        w2.wait(10)
        with psycopg.connect(pg.url) as app:
            app.execute(f'SET search_path TO "{schema}"')
            cronkeeper.enqueue(app, "fails_while_flagged", {"flag": str(config)}, key="second",
                               schema=schema)
        w3 = spawn_json_worker(pg.url, schema, "kill", "w3", tmp_path / "w3.log")
        wait_for(lambda: rows(db, "SELECT count(*) FROM outbox WHERE idempotency_key = 'second' "
                                  "AND state = 'dead'")[0][0], 30, "the second dead letter",
                 alive=w3)
        os.kill(w3.pid, signal.SIGKILL)
        w3.wait(10)
        assert rows(db, "SELECT event, task, state FROM notifications ORDER BY id")[1] == (
            "dead", "fails_while_flagged", "pending")
        w4 = spawn_json_worker(pg.url, schema, "kill", "w4", tmp_path / "w4.log",
                               "--notify-config", str(config))
        wait_for(lambda: any(r.json()["key"] == "second" for r in receiver.posts("/hook")), 30,
                 "the second notification", alive=w4)
        w4.kill()
        w4.wait(10)
        assert sum(r.json()["key"] == "second" for r in receiver.posts("/hook")) == 1
    finally:
        receiver.close()


OUTAGE = 6.0  # seconds with no instance running


def test_an_outage_of_every_daemon_is_one_missed_notification_per_schedule(tmp_path):
    pg = shared_postgres()
    receiver = HttpReceiver()
    schedules = write_schedules(tmp_path / "schedules", {"s.toml": "\n".join([
        schedule_toml("skip-late", every="1s", misfire="skip", grace="2s"),
        schedule_toml("latest-only", every="1s", misfire="latest", grace="2s"),
        schedule_toml("catch-all", every="1s", misfire="catch_up", catch_up_limit="1h"),
    ])})
    config = notify_toml(tmp_path / "notify.toml", receiver.url + "/hook")
    fleet = Fleet(pg, pg.new_schema(), schedules, tmp_path, n=2, leader_timeout=3,
                  extra=["--notify-config", str(config)])
    db = set_path(pg.connect(), fleet.schema)
    try:
        fleet.start()
        wait_for(lambda: rows(db, "SELECT count(DISTINCT schedule) FROM periods")[0][0] == 3, 30,
                 "every schedule to fire before the outage")
        for d in fleet.daemons:
            d.terminate()
        for d in fleet.daemons:
            assert d.stop(15) == 0
        down = db_now(db)
        wait_for(lambda: (db_now(db) - down).total_seconds() >= OUTAGE, OUTAGE + 5, "the outage")
        term = leader_row(db, fleet.cluster).term
        fleet.start()
        new = wait_new_leader(db, fleet.cluster, term, 20, "a leader after the outage")
        skipped = wait_for(lambda: dict(rows(
            db, "SELECT schedule, count(*) FROM periods WHERE term = %s AND reason IN "
                "('misfire', 'coalesced') GROUP BY 1", new.term)), 20, "the outage decided")
        assert set(skipped) == {"skip-late", "latest-only"}  # catch-all emits every period
        missed = wait_for(lambda: [r.json() for r in receiver.posts("/hook")
                                   if r.json()["event"] == "missed"]
                          if len(receiver.posts("/hook")) >= 2 else None, 30,
                          "the missed notifications")
        assert sorted(m["schedule"] for m in missed) == ["latest-only", "skip-late"]
        for m in missed:
            assert m["count"] == skipped[m["schedule"]] >= OUTAGE - 3
            assert m["window"]["from"] < m["window"]["until"] and m["owner"] == "tests"
        assert rows(db, "SELECT count(*) FROM notifications WHERE event = 'missed'")[0][0] == 2
    finally:
        fleet.shutdown()
        receiver.close()


def test_heartbeat_pings_come_from_the_leader_and_stop_with_the_fleet(tmp_path):
    pg = shared_postgres()
    receiver = HttpReceiver()
    schedules = write_schedules(tmp_path / "s", {"s.toml": schedule_toml("tick", every="1h")})
    config = tmp_path / "notify.toml"
    config.write_text('heartbeat_url_env = "HC_URL"\nheartbeat_interval = "1s"\n')
    os.environ["HC_URL"] = receiver.url + "/ping/abc"
    try:
        fleet = Fleet(pg, pg.new_schema(), schedules, tmp_path, n=2, leader_timeout=3,
                      extra=["--notify-config", str(config)])
        db = set_path(pg.connect(), fleet.schema)
        fleet.start()
        leader = wait_for(lambda: leader_row(db, fleet.cluster), 20, "a leader")
        wait_for(lambda: len(receiver.gets()) >= 3, 20, "three pings")
        assert {r.headers.get("X-Cronkeeper-Instance") for r in receiver.gets()} == {
            leader.instance_id}
        assert {r.path for r in receiver.gets()} == {"/ping/abc"}

        fleet.by_id(leader.instance_id).kill()  # the standby takes over and pings in turn
        new = wait_new_leader(db, fleet.cluster, leader.term, 20, "the standby leads")
        wait_for(lambda: any(r.headers.get("X-Cronkeeper-Instance") == new.instance_id
                             for r in receiver.gets()), 20, "a ping from the new leader")
        fleet.shutdown()
        stopped = time.time()
        count = len(receiver.gets())
        # Every daemon has exited: nothing pings any more (the outside switch fires).
        assert all(r.at <= stopped for r in receiver.gets())
        assert len(receiver.gets()) == count
        log = json.dumps([d.records() for d in fleet.daemons])
        assert "Traceback" not in log
    finally:
        os.environ.pop("HC_URL", None)
        receiver.close()
