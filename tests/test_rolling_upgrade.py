"""A fleet of the previous release (0.1.0, built from git history) upgraded one process at a
time to this one, against one database, while every-second schedules fire (SPEC §18;
docs/upgrading.md): no period missed or emitted twice, every job ended, no traceback.

The order is the documented procedure, with the mixed-fleet cases it must survive on the way:
a new worker on the old schema, ``migrate`` under an old leader that keeps writing, a new
standby, the old leader stopped, a new leader killed so that an old standby leads on the new
schema, then the rest replaced until the fleet is all new. A migration that breaks the previous
release's code (a NOT NULL column without a default, a dropped column) fails it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from daemon_harness import (
    CRONKEEPER,
    Daemon,
    Leader,
    audit,
    db_now,
    leader_row,
    set_path,
    shared_postgres,
    wait_for,
    wait_new_leader,
)
from releases import release_bin

OLD = "0.1.0"
STEP = 60.0  # the most any one step may take before the test fails (each takes seconds)


def schedule_files(directory: Path, effects: Path) -> Path:
    """Two command schedules firing every second, each run appending its key to ``effects``."""
    directory.mkdir(parents=True, exist_ok=True)
    command = f'["/bin/sh", "-c", "echo \\"$CRONKEEPER_IDEMPOTENCY_KEY\\" >> {effects}"]'
    common = ('timezone = "UTC"\nmisfire = "catch_up"\ncatch_up_limit = "1h"\noverlap = "allow"\n'
              f'command = {command}\ntimeout = "30s"\nowner = "tests"\n')
    (directory / "ticks.toml").write_text(
        f'[tick-every]\nevery = "1s"\n{common}\n[tick-cron]\ncron = "* * * * * *"\n{common}')
    os.chmod(directory, 0o755)
    os.chmod(directory / "ticks.toml", 0o644)
    return directory


class Worker:
    def __init__(self, exe: str, url: str, schema: str, cluster: str, schedules: Path,
                 instance_id: str, log_dir: Path) -> None:
        self.instance_id = instance_id
        self.log_path = log_dir / f"{instance_id}.log"
        argv = [exe, "worker", "--database-url", url, "--schema", schema, "--cluster", cluster,
                "--schedules", str(schedules), "--instance-id", instance_id,
                "--metrics-address", "off", "--log-format", "json", "--poll-interval", "0.2"]
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(STEP)


def run_cli(exe: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=STEP)


def emitted_by(conn: psycopg.Connection, term: int, after: datetime) -> int:
    return conn.execute("SELECT count(*) FROM periods WHERE term = %s AND decided_at > %s",
                        (term, after)).fetchone()[0]


def ran_by(conn: psycopg.Connection, worker_id: str) -> int:
    return conn.execute("SELECT count(*) FROM attempts WHERE worker_id = %s AND outcome = "
                        "'succeeded'", (worker_id,)).fetchone()[0]


def standby(conn: psycopg.Connection, cluster: str, daemon: Daemon, what: str) -> None:
    """Wait until ``daemon``'s latest start is ready (its log says so) and it is not leading."""
    daemon.wait_log(lambda r: r.get("action") == "ready", STEP, what)
    leader = wait_for(lambda: leader_row(conn, cluster), STEP, "a leader row")
    assert leader.instance_id != daemon.instance_id, f"{what}: it leads"


def leads_and_writes(conn: psycopg.Connection, cluster: str, daemon: Daemon, after_term: int,
                     what: str) -> Leader:
    """Wait until ``daemon`` holds a term newer than ``after_term`` and has decided periods in
    it: leadership is progress, not just a held lock."""
    leader = wait_new_leader(conn, cluster, after_term, STEP, what)
    assert leader.instance_id == daemon.instance_id, f"{what}: {leader.instance_id} leads"
    since = db_now(conn)
    wait_for(lambda: emitted_by(conn, leader.term, since) >= 2, STEP, f"{what}: its periods")
    return leader


@pytest.fixture
def fleet_dir(tmp_path: Path) -> Path:
    return tmp_path


def test_rolling_upgrade_from_the_previous_release(fleet_dir: Path) -> None:
    old_exe = str(release_bin(OLD))
    pg = shared_postgres()
    schema = f"u_{uuid.uuid4().hex[:12]}"
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    effects = fleet_dir / "effects.txt"
    effects.touch()
    schedules = schedule_files(fleet_dir / "schedules", effects)
    logs = fleet_dir / "logs"
    logs.mkdir()
    started = time.monotonic()

    made = run_cli(old_exe, "migrate", "--database-url", pg.url, "--schema", schema)
    assert made.returncode == 0, made.stderr

    def daemon(exe: str, instance_id: str) -> Daemon:
        d = Daemon(url=pg.url, schema=schema, cluster=cluster, schedules=schedules,
                   instance_id=instance_id, log_dir=logs)
        d.argv[0] = exe
        return d

    old_a, old_b = daemon(old_exe, "old-a"), daemon(old_exe, "old-b")
    new_c, new_d = daemon(CRONKEEPER, "new-c"), daemon(CRONKEEPER, "new-d")
    daemons = [old_a, old_b, new_c, new_d]
    workers: list[Worker] = []
    conn = set_path(pg.connect(), schema)
    takeovers = 0
    try:
        # A fleet of 0.1.0: two daemons, one worker.
        old_a.start()
        term = leads_and_writes(conn, cluster, old_a, 0, "the old fleet's leader").term
        old_b.start()
        old_worker = Worker(old_exe, pg.url, schema, cluster, schedules, "old-w", logs)
        workers.append(old_worker)
        wait_for(lambda: ran_by(conn, "old-w") >= 2, STEP, "the old worker running jobs")

        # 1. A worker of this release, on the schema 0.1.0 made (not yet migrated).
        workers.append(Worker(CRONKEEPER, pg.url, schema, cluster, schedules, "new-w", logs))
        wait_for(lambda: ran_by(conn, "new-w") >= 2, STEP, "the new worker on the old schema")

        # 2. migrate, while the old leader leads: it keeps writing jobs on the new schema.
        migrated_at = db_now(conn)
        done = run_cli(CRONKEEPER, "migrate", "--database-url", pg.url, "--schema", schema)
        assert done.returncode == 0, done.stderr
        assert "applied migrations" in done.stdout, done.stdout
        wait_for(lambda: emitted_by(conn, term, migrated_at) >= 4, STEP,
                 "the old leader writing after migrate")
        dry = run_cli(CRONKEEPER, "migrate", "--dry-run", "--database-url", pg.url,
                      "--schema", schema, "--cluster", cluster, "--format", "json")
        plan = json.loads(dry.stdout)
        assert dry.returncode == 0 and plan["pending"] == [], dry.stdout + dry.stderr
        assert {i["instance_id"] for i in plan["instances"]} >= {"old-a", "old-b", "old-w", "new-w"}
        assert all(i["compatible"] for i in plan["instances"]), plan

        # 0.1.0 predates the policy: started now, it refuses the newer schema, saying so.
        refused = run_cli(old_exe, "status", "--database-url", pg.url, "--schema", schema)
        assert refused.returncode != 0 and "newer than this cronkeeper knows" in refused.stderr

        # 3. A standby of this release.
        new_c.start()
        standby(conn, cluster, new_c, "the new standby registered")

        # 4. The old leader stopped: a standby (old or new) leads.
        assert old_a.stop() == 0
        leader = wait_new_leader(conn, cluster, term, STEP, "a leader after the old one stopped")
        takeovers += 1
        term = leader.term
        if leader.instance_id == "old-b":
            # Depose it (its lock session ended, as a standby does to a frozen leader): it
            # queues again behind the new standby, which leads.
            conn.execute("SELECT pg_terminate_backend(%s)", (leader.backend_pid,))
            term = leads_and_writes(conn, cluster, new_c, term, "the new standby after old-b").term
            takeovers += 1

        # 5. The new leader killed while an old standby remains: 0.1.0 leads on the new schema.
        new_c.kill()
        term = leads_and_writes(conn, cluster, old_b, term, "the old standby after new-c died").term
        takeovers += 1

        # 6. The rest, one at a time, until the fleet is all new.
        new_d.start()
        standby(conn, cluster, new_d, "the second new standby registered")
        assert old_worker.stop() == 0
        assert old_b.stop() == 0
        term = leads_and_writes(conn, cluster, new_d, term, "the new fleet's leader").term
        takeovers += 1
        new_c.start()  # the killed one comes back as a standby of the new release
        standby(conn, cluster, new_c, "new-c back as a standby")

        # The end: the daemons stop, the new worker finishes every job they wrote.
        until = db_now(conn)
        for d in (new_c, new_d):
            assert d.stop() == 0
        wait_for(lambda: conn.execute(
            "SELECT count(*) = 0 FROM outbox WHERE state <> 'succeeded'").fetchone()[0],
            STEP, "every job ended")
        for w in workers:
            if w.proc.poll() is None:
                assert w.stop() == 0

        result = audit(conn, until=until - timedelta(seconds=1))
        assert result.problems() == {}, result.problems()
        jobs = conn.execute("SELECT idempotency_key FROM outbox").fetchall()
        ran = effects.read_text().split()
        assert sorted(ran) == sorted(k for (k,) in jobs), "each job's effect exactly once"
        history = run_cli(CRONKEEPER, "history", "--database-url", pg.url, "--schema", schema,
                          "--since", "1h", "--until", until.isoformat(), "--format", "json")
        summary = json.loads(history.stdout)["summary"]
        assert history.returncode == 0, history.stdout[-2000:]
        assert all(s["missing"] == 0 and s["dead"] == 0 for s in summary), summary
        # Both releases read the same files as the same set: one version per schedule (a
        # change of the stored spec's form would record a new version at the first new leader
        # and make the digests disagree during every upgrade: say so in docs/upgrading.md).
        versions = conn.execute("SELECT schedule, count(*) FROM schedule_versions GROUP BY 1"
                                " ORDER BY 1").fetchall()
        assert versions == [("tick-cron", 1), ("tick-every", 1)], versions
        digests = conn.execute("SELECT count(DISTINCT schedules_digest) FROM instances WHERE "
                               "cluster = %s AND kind = 'scheduler'", (cluster,)).fetchone()[0]
        assert digests == 1, "0.1.0 and this release digest the same files differently"
        by_term = dict(conn.execute("SELECT term, count(*) FROM periods GROUP BY 1").fetchall())
        for path in logs.iterdir():
            assert "Traceback" not in path.read_text(), f"{path.name}:\n{path.read_text()[-3000:]}"
        print(f"rolling upgrade {OLD} -> this release: {result.periods} periods, {len(jobs)} jobs, "
              f"terms {sorted(by_term)} ({takeovers} takeovers), "
              f"{time.monotonic() - started:.0f}s")
    finally:
        for d in daemons:
            with contextlib.suppress(Exception):
                d.kill()
        for w in workers:
            with contextlib.suppress(Exception):
                w.proc.kill()
                w.proc.wait(10)
        conn.close()
        with contextlib.suppress(Exception), psycopg.connect(pg.url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
