"""A daemon, worker or relay started while PostgreSQL cannot be reached (restarting, failing over)
waits for it with backoff, as it does once running (SPEC §10), instead of exiting: the soak
found `cronkeeper run` exiting 1 ("checking the schema version: connection failed") when
restarted during a PostgreSQL restart. Unreachable here means a loopback relay that closes
every connection at once (its upstream port refuses), until it is pointed at the server."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest
from daemon_harness import (
    CRONKEEPER,
    Daemon,
    _free_port,
    leader_row,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)
from loopback_relay import Relay


@pytest.fixture
def unreachable(tmp_path):
    pg = shared_postgres()
    schema = pg.new_schema()
    relay = Relay(_free_port())  # nothing listens there: every connection is closed at once
    url = pg.url.replace(f":{pg.port}/", f":{relay.port}/")
    procs: list = []
    yield pg, schema, relay, url, procs
    for p in procs:
        p.kill()
        if isinstance(p, subprocess.Popen):
            p.wait(10)
    relay.close()


def test_run_worker_and_relay_started_without_a_database_wait_for_it_then_work(unreachable, tmp_path):
    pg, schema, relay, url, procs = unreachable
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    schedules = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("tick", every="1s")})
    daemon = Daemon(url=url, schema=schema, cluster=cluster, schedules=schedules,
                    instance_id="early", log_dir=tmp_path).start()
    procs.append(daemon)
    log = open(tmp_path / "worker.log", "a")  # noqa: SIM115 - the child owns it
    worker = subprocess.Popen(
        [CRONKEEPER, "worker", "--database-url", url, "--schema", schema, "--cluster", cluster,
         "--instance-id", "early-worker", "--metrics-address", "off", "--log-format", "json"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=os.environ)
    procs.append(worker)
    config = tmp_path / "relay.toml"
    config.write_text('[targets.rq-main]\nkind = "rq"\nredis = "redis://127.0.0.1:6379/0"\n\n'
                      '[[routes]]\ntasks = ["nothing.*"]\ntarget = "rq-main"\n')
    relay_log = open(tmp_path / "relay.log", "a")  # noqa: SIM115 - the child owns it
    relay_proc = subprocess.Popen(
        [CRONKEEPER, "relay", "--config", str(config), "--database-url", url, "--schema", schema,
         "--cluster", cluster, "--instance-id", "early-relay", "--metrics-address", "off",
         "--log-format", "json"],
        stdout=relay_log, stderr=relay_log, stdin=subprocess.DEVNULL, env=os.environ)
    procs.append(relay_proc)

    daemon.wait_log(lambda r: r.get("action") == "db_unavailable", 30, "the wait said")
    for name in ("worker", "relay"):
        wait_for(lambda name=name: '"db_unavailable"' in (tmp_path / f"{name}.log").read_text(),
                 30, f"the {name}'s wait said")
    # Both keep trying (every 5 s at most) but say so once, not once per try (SPEC §10: once
    # a minute, not in a flood): a chosen wait of 8 s, five tries of each (0.5 + 1 + 2 + 4 s).
    waited_from = time.monotonic()
    wait_for(lambda: time.monotonic() - waited_from >= 8, 10, "a few tries of each")
    assert daemon.alive() and worker.poll() is None and relay_proc.poll() is None, \
        "a process exited instead of waiting"

    relay.target_port = pg.port  # the database comes back
    with set_path(pg.connect(), schema) as db:
        wait_for(lambda: (r := leader_row(db, cluster)) and r.instance_id == "early", 30,
                 "the daemon to lead once the database answers")
        wait_for(lambda: db.execute("SELECT 1 FROM instances WHERE instance_id = 'early-worker'")
                 .fetchone(), 30, "the worker to register")
        wait_for(lambda: db.execute("SELECT 1 FROM instances WHERE instance_id = 'early-relay'")
                 .fetchone(), 30, "the relay to register")
    worker_log = (tmp_path / "worker.log").read_text()
    relay_text = (tmp_path / "relay.log").read_text()
    assert worker_log.count('"db_unavailable"') == 1, worker_log
    assert relay_text.count('"db_unavailable"') == 1, relay_text
    assert "database reachable after" in relay_text, relay_text
    assert [r["action"] for r in daemon.records() if r.get("action") in
            ("db_unavailable", "db_reconnected")] == ["db_unavailable", "db_reconnected"]
    assert "database reachable after" in worker_log, worker_log
    assert "Traceback" not in daemon.log_text() + worker_log + relay_text


def test_a_schema_that_is_behind_still_ends_the_daemon_at_once(tmp_path):
    """Waiting is for a database that cannot be reached, never for one that answers 'no'."""
    pg = shared_postgres()
    schema = f"empty_{uuid.uuid4().hex[:8]}"  # never migrated
    schedules = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("tick", every="1s")})
    proc = subprocess.run(
        [CRONKEEPER, "run", "--database-url", pg.url, "--schema", schema, "--schedules",
         str(schedules), "--metrics-address", "off"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "migrate" in proc.stderr and "Traceback" not in proc.stderr
