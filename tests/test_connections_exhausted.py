"""PostgreSQL refusing connections because every slot is taken (issue 21 §2, SPEC §10): another
client holds every free slot of a private server with a small ``max_connections``, and the
sessions of a leader, a standby, a worker and a relay (publishing a second schedule's jobs to
RQ, on the Redis of the test services) are terminated, so that each must reconnect and is told
``FATAL: sorry, too many clients already``, for HOLD seconds.

What must hold: no process exits; each says what is wrong when it begins and when it changes,
never once per retry (before ``cronkeeper.outage``, the leader logged a line per backoff step,
8 in 20 s); the leader does not flap (no win and loss per backoff step); once the slots are
freed every process says it is back with how long it was away, periods fire again, jobs run,
every period of the whole run is decided exactly once (catch_up: the outage's periods are
decided once leadership returns), and every job ends (the worker's succeeded, the relay's
published, each once to the queue).

Everyone here connects as a superuser (trust auth), so ``superuser_reserved_connections`` holds
nothing back: the test keeps its own connection, opened before the slots are filled.
"""

from __future__ import annotations

import re
import signal
import subprocess
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import redis
from daemon_harness import (
    CRONKEEPER,
    Fleet,
    PrivatePostgres,
    audit,
    db_now,
    json_records,
    leader_row,
    schedule_toml,
    set_path,
    spawn_json_worker,
    wait_for,
    write_schedules,
)
from faults import SlotHog

from cronkeeper.outage import kind_of

REDIS = "redis://127.0.0.1:6379/0"
MAX_CONNECTIONS = 30  # the fleet holds 14 (docs/operations.md); the rest is filled
HOLD = 25.0  # seconds with every slot taken
# The log lines that say the database is away (daemon, worker, listener) or that leadership went.
AWAY = {"db_unavailable", "database_unavailable", "listen_lost", "leader_lost"}
BACK = {"db_reconnected", "database_reconnected", "listen_restored"}
REPORTERS = {  # what says an outage began (and its kind changed, or a minute passed): its end
    "daemon's session loop": ({"leader_lost", "db_unavailable"}, "db_reconnected"),
    "lease holder's database seam": ({"database_unavailable"}, "database_reconnected"),
    "worker's listener": ({"listen_lost"}, "listen_restored"),
}


def problem(line: dict[str, Any]) -> str:
    """The kind of problem a line names: its error text (``error=...`` in the worker's lines,
    after the first colon in the daemon's), without numbers."""
    message = line["message"]
    if "error=" in message:
        text = re.split(r" \(said|: polling", message.split("error=", 1)[1])[0]
    else:
        text = message.split(": ", 1)[-1].split(";")[0]
    return kind_of(text)


@pytest.fixture
def server():
    pg = PrivatePostgres(max_connections=MAX_CONNECTIONS,
                         settings={"superuser_reserved_connections": "0"}).start()
    yield pg
    pg.stop()


def test_every_slot_taken_is_survived_said_once_and_resumed_with_nothing_lost(server, tmp_path):
    pg = server
    db = psycopg.connect(pg.url, autocommit=True, application_name="test", connect_timeout=10)
    schema = pg.new_schema()
    set_path(db, schema)
    schedules = write_schedules(tmp_path / "s", {"tick.toml": schedule_toml(
        "tick", every="1s", misfire="catch_up", catch_up_limit="1h", task="noop") + "\n"
        + schedule_toml("relayed", every="1s", misfire="catch_up", catch_up_limit="1h",
                        task="relay.tick")})
    queue = f"ck-exhausted-{uuid.uuid4().hex[:8]}"
    relay_config = tmp_path / "relay.toml"
    relay_config.write_text(f'[targets.rq-main]\nkind = "rq"\nredis = "{REDIS}"\n\n[[routes]]\n'
                            f'tasks = ["relay.*"]\ntarget = "rq-main"\nqueue = "{queue}"\n')
    relay_log = tmp_path / "relay.log"
    relay: subprocess.Popen | None = None
    fleet = Fleet(pg, schema, schedules, tmp_path, n=2)
    worker_log = tmp_path / "worker.log"
    worker: subprocess.Popen | None = None

    hog = SlotHog(pg, db)
    cronkeeper_backends = hog.cronkeeper_backends

    try:
        fleet.start()
        worker = spawn_json_worker(pg.url, schema, fleet.cluster, "w1", worker_log,
                                   "--task", "noop")
        with open(relay_log, "a") as out:
            relay = subprocess.Popen(
                [CRONKEEPER, "relay", "--config", str(relay_config), "--database-url", pg.url,
                 "--schema", schema, "--cluster", fleet.cluster, "--instance-id", "r1",
                 "--metrics-address", "off", "--log-format", "json"],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        wait_for(lambda: db.execute("SELECT count(*) FROM outbox WHERE state = 'published'")
                 .fetchone()[0] >= 3, 40, "the relay to publish before the outage", interval=0.2)
        wait_for(lambda: db.execute("SELECT count(*) FROM outbox WHERE state = 'succeeded'")
                 .fetchone()[0] >= 3, 40, "jobs to run before the outage", interval=0.2)
        leader = leader_row(db, fleet.cluster)
        assert leader is not None
        wait_for(lambda: len(cronkeeper_backends()) >= 6, 10, "the standby and the listener")
        print("\nsessions before the outage:", dict(db.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE application_name LIKE 'cronkeeper%%' GROUP BY 1 ORDER BY 1").fetchall()))

        marks = {d.instance_id: len(d.records()) for d in fleet.daemons}
        worker_mark, relay_mark = len(json_records(worker_log)), len(json_records(relay_log))
        wait_for(hog.squeeze, 30, "every slot taken and no cronkeeper session left", interval=0.05)
        start = db_now(db)

        def refused() -> bool:
            """Each process has met the refusal (and so noticed its session's end first)."""
            since = [d.records()[marks[d.instance_id]:] for d in fleet.daemons]
            since += [json_records(worker_log)[worker_mark:], json_records(relay_log)[relay_mark:]]
            return all(any("too many clients" in r.get("message", "") for r in lines)
                       for lines in since)
        wait_for(refused, 20, "every process to be refused a connection", interval=0.2)
        hold_marks = {d.instance_id: len(d.records()) for d in fleet.daemons}
        worker_hold_mark, relay_hold_mark = len(json_records(worker_log)), len(json_records(relay_log))
        held_term = leader_row(db, fleet.cluster).term  # a standby may have led in the squeeze
        last_before = db.execute("SELECT max(scheduled_for) FROM periods").fetchone()[0]

        def held() -> bool:
            assert not cronkeeper_backends(), "a cronkeeper process got a slot during the hold"
            return (db_now(db) - start).total_seconds() >= HOLD
        wait_for(held, HOLD + 15, "the hold", interval=0.5)
        assert all(d.alive() for d in fleet.daemons), fleet.logs()
        assert worker.poll() is None, worker_log.read_text()[-3000:]
        assert relay.poll() is None, relay_log.read_text()[-3000:]

        lines = {d.instance_id: d.records()[marks[d.instance_id]:] for d in fleet.daemons}
        lines["w1"] = json_records(worker_log)[worker_mark:]
        lines["r1"] = json_records(relay_log)[relay_mark:]
        in_hold = {d.instance_id: d.records()[hold_marks[d.instance_id]:] for d in fleet.daemons}
        in_hold["w1"] = json_records(worker_log)[worker_hold_mark:]
        in_hold["r1"] = json_records(relay_log)[relay_hold_mark:]
        for who, said in lines.items():
            about = [r for r in said if r.get("action") in AWAY | BACK]
            print(f"\n{who}: {len(about)} lines from the squeeze to the end of the hold:",
                  *(f"\n  {r['action']}: {r['message']}" for r in about))
            for reporter, (failed, back) in REPORTERS.items():  # one outage: back splits them
                outage: Counter[str] = Counter()
                for r in about:
                    if r["action"] in failed:
                        outage[problem(r)] += 1
                        assert outage[problem(r)] == 1, (who, reporter, "said twice", r, about)
                    elif r["action"] == back:
                        outage.clear()
        for who, said in in_hold.items():  # no flapping: once refused, nothing won, lost or back
            actions = Counter(r.get("action") for r in said)
            assert not actions.keys() & (BACK | {"leader_won", "leader_lost"}), (who, actions)
            # (a killed session shows as lost, terminated or closed, then refused: a few kinds)
            assert sum(actions[a] for a in AWAY) <= 5, (who, said)
        assert any(r.get("action") == "leader_lost" for r in lines[leader.instance_id])

        freed = db_now(db)
        hog.release()
        new = wait_for(lambda: (r := leader_row(db, fleet.cluster)) and r.term > held_term
                       and r.released_at is None and r, 30, "a leader once the slots are free")
        wait_for(lambda: db.execute("SELECT count(*) FROM outbox WHERE state = 'succeeded' "
                                    "AND scheduled_for > %s", (freed,)).fetchone()[0] >= 2, 30,
                 "jobs of periods after the outage to run", interval=0.2)
        first_decision, first_run = db.execute(
            "SELECT (SELECT min(decided_at) FROM periods WHERE decided_at > %(t)s),"
            " (SELECT min(finished_at) FROM attempts WHERE started_at > %(t)s)",
            {"t": freed}).fetchone()
        print(f"\nslots freed: a period decided {(first_decision - freed).total_seconds():.1f} s"
              f" later (term {new.term}), a job run {(first_run - freed).total_seconds():.1f} s"
              " later")
        for d in fleet.daemons:
            d.wait_log(lambda r: r.get("action") == "db_reconnected", 20, "saying it is back")
        for name, path, mark in (("worker", worker_log, worker_mark),
                                 ("relay", relay_log, relay_mark)):
            wait_for(lambda path=path, mark=mark: any(
                r.get("action") == "database_reconnected" for r in json_records(path)[mark:]), 20,
                f"the {name} saying it is back")
        wait_for(lambda: db.execute("SELECT count(*) FROM outbox WHERE state = 'published' "
                                    "AND scheduled_for > %s", (freed,)).fetchone()[0] >= 2, 30,
                 "the relay to publish periods after the outage", interval=0.2)
        # the outage's own periods were decided once leadership returned (catch_up)
        outage_periods = db.execute(
            "SELECT count(*) FROM periods WHERE scheduled_for > %s AND scheduled_for < %s",
            (last_before, freed)).fetchone()[0]
        assert outage_periods >= HOLD - 1, outage_periods
        wait_for(lambda: not audit(db, margin=1.5).missing, 30, "every due period decided",
                 interval=0.2)
        until = db_now(db) - timedelta(seconds=1.5)
        assert all(d.alive() for d in fleet.daemons), fleet.logs()
        assert worker.poll() is None, worker_log.read_text()[-3000:]
        assert relay.poll() is None, relay_log.read_text()[-3000:]

        for d in fleet.daemons:
            d.terminate()
        for d in fleet.daemons:
            assert d.stop(15) == 0, d.log_text()[-2000:]
        result = audit(db, until=until)
        assert not result.problems(), result.problems()
        assert result.periods >= (until - start).total_seconds(), result.periods
        wait_for(lambda: db.execute("SELECT count(*) FROM outbox WHERE state IN "
                                    "('available', 'running')").fetchone()[0] == 0, 60,
                 "every job to end", interval=0.2)
        states = dict(db.execute("SELECT task, array_agg(DISTINCT state::text) FROM outbox"
                                 " GROUP BY 1").fetchall())
        assert states == {"noop": ["succeeded"], "relay.tick": ["published"]}, states
        keys = [k for (k,) in db.execute("SELECT idempotency_key FROM outbox WHERE task = "
                                         "'relay.tick'")]
        assert redis.Redis.from_url(REDIS).llen(f"rq:queue:{queue}") == len(keys)
        for proc, path in ((worker, worker_log), (relay, relay_log)):
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, path.read_text()[-3000:]
        assert "Traceback" not in fleet.logs() + worker_log.read_text() + relay_log.read_text()
    finally:
        hog.release()
        fleet.shutdown()
        for proc in (worker, relay):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        client = redis.Redis.from_url(REDIS)
        for key in client.lrange(f"rq:queue:{queue}", 0, -1):
            client.delete(f"rq:job:{key.decode()}")
        client.delete(f"rq:queue:{queue}")
        db.close()
