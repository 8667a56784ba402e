"""PostgreSQL itself fails over (issue 9 §2): a private primary and a streaming replica
(``pg_basebackup -R``) on loopback, three daemons and two workers connected with libpq's
multi-host URL (``host1:p1,host2:p2`` with ``target_session_attrs=read-write``), the primary
stopped with ``pg_ctl stop -m immediate`` (every backend gone at once, no shutdown checkpoint)
while jobs are running, and the replica promoted (``pg_ctl promote``).

- asynchronous replication: the replica streams through a loopback relay that is cut for the
  last seconds before the crash (and severed with it), so the old primary commits periods, jobs and attempts the replica
  never gets: the loss asynchronous replication allows, made certain. The new leader plans from
  the latest period the new primary knows, so every lost period is decided again under its
  policy (catch_up: emitted again, same key; skip: recorded skipped ``misfire`` once beyond
  grace); none is left without an outcome and ``history`` reports nothing missing.
- synchronous replication (``synchronous_standby_names = '*'``): no commit the old primary
  acknowledged is lost: every period an observer read from it before the crash is on the new one.

Both: every process reconnects by itself and one daemon leads (the time from the crash to the
new term is measured and printed; the test asserts only a generous liveness bound), no period
has two jobs on the new primary, and every job that was running at the crash runs again and
succeeds there (its run log shows a run that started after the crash)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from daemon_harness import (
    CRONKEEPER,
    Daemon,
    PrivatePostgres,
    assert_audit_clean,
    audit,
    db_now,
    leader_row,
    schedule_toml,
    set_path,
    wait_for,
    write_schedules,
)
from loopback_relay import Relay

CLUSTER = "failover"
LIVENESS_BOUND = 60.0  # not a timing claim: only "a leader came back at all"


class Pair:
    """A primary and a streaming replica of it, each a PrivatePostgres of its own."""

    def __init__(self, synchronous: bool) -> None:
        settings = {"wal_level": "replica", "max_wal_senders": "5", "hot_standby": "on",
                    "wal_keep_size": "256MB"}
        self.primary = PrivatePostgres(settings=settings).start()
        # The replica streams through a loopback relay, so the test can hold WAL back from it.
        self.link = Relay(self.primary.port)
        self.replica = PrivatePostgres(settings={
            "hot_standby": "on",
            "primary_conninfo": f"'host=127.0.0.1 port={self.link.port} user=postgres'"})
        self.replica.data.mkdir(mode=0o700)
        if self.replica.user is not None:
            subprocess.run(["chown", self.replica.user, str(self.replica.data)], check=True)
        self.replica._run("pg_basebackup", "-D", str(self.replica.data), "-R", "-X", "stream",
                          "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
                          "--no-sync", "--checkpoint=fast", timeout=120)
        self.replica.start()
        with self.primary.connect() as conn:
            wait_for(lambda: conn.execute("SELECT count(*) FROM pg_stat_replication"
                                          " WHERE state = 'streaming'").fetchone()[0] == 1,
                     60, "the replica to stream")
            if synchronous:  # from now on a commit waits until the replica has it on disk
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")
                wait_for(lambda: conn.execute("SELECT sync_state FROM pg_stat_replication")
                         .fetchone()[0] == "sync", 30, "the replica to be synchronous")

    @property
    def url(self) -> str:
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.replica.port}"
                f"/{self.primary.database}?target_session_attrs=read-write")

    def stop(self) -> None:
        self.link.sever()
        self.replica.stop()
        self.primary.stop()


def start_worker(url: str, schema: str, name: str, tmp_path: Path) -> subprocess.Popen:
    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": here, "FAILOVER_RUN_LOG": str(tmp_path / "runs.log")}
    log = open(tmp_path / f"{name}.log", "a")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(
        [CRONKEEPER, "worker", "--database-url", url, "--schema", schema, "--cluster", CLUSTER,
         "--import", "handlers_for_tests", "--instance-id", name, "--poll-interval", "0.2",
         "--lease-margin", "3", "--metrics-address", "off", "--log-format", "json"],
        env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)


def decided(conn: psycopg.Connection) -> dict[tuple[str, object], str]:
    return {(s, t): f"{o}:{r}" if r else o for s, t, o, r in conn.execute(
        "SELECT schedule, scheduled_for, outcome, reason FROM periods")}


@pytest.fixture(params=["async", "sync"])
def setup(request, tmp_path):
    pair = Pair(synchronous=request.param == "sync")
    schema = pair.primary.new_schema()
    with set_path(pair.primary.connect(), schema) as conn:
        conn.execute("CREATE TABLE runs (key text NOT NULL, pid integer NOT NULL)")
    common = 'timeout = "20s"\nbackoff = { base = "0.2s", factor = 2, max = "1s" }\n'
    schedules = write_schedules(tmp_path / "schedules", {"f.toml": "\n".join([
        schedule_toml("catch-up-1s", cron="* * * * * *", task="failover_work").replace(
            'owner = "tests"', 'owner = "tests"\npayload = { sleep = 2.5 }\n' + common),
        schedule_toml("skip-2s", every="2s", misfire="skip", grace="1s", task="failover_work")
        .replace('owner = "tests"', 'owner = "tests"\n' + common),
        schedule_toml("latest-3s", every="3s", misfire="latest", grace="1s", task="failover_work")
        .replace('owner = "tests"', 'owner = "tests"\n' + common),
    ])})
    daemons = [Daemon(url=pair.url, schema=schema, cluster=CLUSTER, schedules=schedules,
                      instance_id=f"node{i}", log_dir=tmp_path) for i in range(3)]
    workers: list[subprocess.Popen] = []
    yield request.param, pair, schema, daemons, workers, tmp_path
    for d in daemons:
        d.kill()
    for w in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.pid, signal.SIGKILL)
        w.wait(10)
    pair.stop()


def test_primary_crash_and_promotion_every_process_follows_nothing_silent(setup):
    mode, pair, schema, daemons, workers, tmp = setup
    for d in daemons:
        d.start()
    workers += [start_worker(pair.url, schema, f"worker{i}", tmp) for i in range(2)]
    old = set_path(pair.primary.connect(), schema)
    first = wait_for(lambda: leader_row(old, CLUSTER), 30, "a leader on the primary")
    wait_for(lambda: old.execute("SELECT count(*) FROM outbox WHERE state = 'succeeded'")
             .fetchone()[0] >= 3, 60, "jobs completed on the primary")
    wait_for(lambda: old.execute("SELECT count(*) FROM outbox WHERE state = 'running'")
             .fetchone()[0] >= 2, 30, "jobs running")

    if mode == "async":  # make the loss certain: WAL stops reaching the replica, the primary goes on
        pair.link.cut()
        before = len(decided(old))
        wait_for(lambda: len(decided(old)) >= before + 4, 20, "periods the replica never gets")
    seen = decided(old)  # acknowledged commits, as a client of the old primary saw them
    in_flight = {k for (k,) in old.execute("SELECT idempotency_key FROM outbox WHERE state = 'running'")}
    runs_log = tmp / "runs.log"
    runs_before = len(runs_log.read_text().splitlines())
    assert in_flight, "no job was running at the crash: the test would prove nothing"

    with pair.replica.connect() as rconn:
        crashed_at = db_now(rconn)  # one host, one clock: the replica's reading is the instant
    pair.primary._run("pg_ctl", "-D", str(pair.primary.data), "-w", "-m", "immediate", "stop")
    pair.primary.running = False
    old.close()
    pair.link.sever()  # what the cut held back dies with the primary
    with set_path(pair.replica.connect(), schema) as rconn:
        kept = decided(rconn)
    lost = {p: o for p, o in seen.items() if p not in kept}
    with pair.replica.connect() as rconn:
        promoted_at = db_now(rconn)  # the promotion is requested right after this reading
    pair.replica._run("pg_ctl", "-D", str(pair.replica.data), "-w", "-t", "60", "promote")
    new = set_path(pair.replica.connect(), schema)

    leader = wait_for(lambda: (r := leader_row(new, CLUSTER)) and r.since > crashed_at and r,
                      LIVENESS_BOUND, "a daemon to lead on the promoted replica")
    after_crash = (leader.since - crashed_at).total_seconds()
    after_promote = (leader.since - promoted_at).total_seconds()
    print(f"\n[{mode}] leader {leader.instance_id} term {leader.term} (was {first.term}): "
          f"{after_crash:.2f}s after the crash, {after_promote:.2f}s after `pg_ctl promote` began; "
          f"{len(seen)} periods seen on the old primary, {len(lost)} lost by the promotion, "
          f"{len(in_flight)} jobs in flight")

    # Every instance and worker reconnected: three lock sessions on the new primary.
    wait_for(lambda: new.execute("SELECT count(*) FROM pg_stat_activity"
                                 " WHERE application_name LIKE 'cronkeeper-lock:%%'").fetchone()[0] == 3,
             30, "all three daemons on the new primary")
    wait_for(lambda: new.execute("SELECT count(DISTINCT instance_id) FROM instances WHERE kind = 'worker'"
                                 " AND heartbeat_at > %s", (promoted_at,)).fetchone()[0] == 2,
             30, "both workers heartbeating on the new primary")

    # The periods the promotion lost are decided again, under their policy; nothing is missing.
    if mode == "sync":
        assert lost == {}, f"synchronous replication lost acknowledged periods: {lost}"
    else:
        assert lost, "the frozen WAL receiver should have cost the replica some periods"
    wait_for(lambda: not audit(new).missing, 30, "every period due decided on the new primary")
    now_decided = decided(new)
    redecided = {p: (o, now_decided.get(p)) for p, o in lost.items()}
    print(f"[{mode}] lost periods decided again (old outcome, new outcome): "
          + ", ".join(f"{s}@{t:%H:%M:%S} {a}->{b}" for (s, t), (a, b) in sorted(redecided.items())))
    assert all(b is not None for _, b in redecided.values()), redecided
    assert all(b == "emitted" for (s, _), (_, b) in redecided.items() if s == "catch-up-1s")
    result = assert_audit_clean(new, context=f"{mode} failover")
    history = subprocess.run([CRONKEEPER, "history", "--database-url", pair.url, "--schema", schema,
                              "--since", "1h", "--format", "json"], capture_output=True, text=True)
    summary = json.loads(history.stdout)["summary"] if history.stdout.startswith("{") else None
    assert history.returncode == 0 and summary and not any(s["missing"] for s in summary), (
        history.stdout[-2000:] + history.stderr)

    # Every job in flight at the crash runs again on the new primary and succeeds there.
    def rerun_and_done():
        runs = runs_log.read_text().splitlines()[runs_before:]
        rerun = {line.split("\t")[0] for line in runs}
        states = dict(new.execute("SELECT idempotency_key, state FROM outbox"
                                  " WHERE idempotency_key = ANY(%s)", (list(in_flight),)).fetchall())
        gone = {k for k in in_flight if k not in states}  # lost with the promotion and re-decided
        return all(k in rerun and states[k] == "succeeded" for k in in_flight - gone)
    try:
        wait_for(rerun_and_done, 60, "every in-flight job re-run and succeeded", interval=0.2)
    except AssertionError as exc:
        jobs = new.execute("SELECT idempotency_key, state, attempts, leased_by, lease_expires_at,"
                           " last_error FROM outbox WHERE idempotency_key = ANY(%s)",
                           (list(in_flight),)).fetchall()
        attempts = new.execute("SELECT o.idempotency_key, a.attempt, a.worker_id, a.outcome, a.error"
                               " FROM attempts a JOIN outbox o ON o.id = a.job_id"
                               " WHERE o.idempotency_key = ANY(%s) ORDER BY 1, 2",
                               (list(in_flight),)).fetchall()
        logs = "\n".join((tmp / f"worker{i}.log").read_text()[-3000:] for i in range(2))
        raise AssertionError(f"{exc}\njobs: {jobs}\nattempts: {attempts}\nruns after the crash: "
                             f"{runs_log.read_text().splitlines()[runs_before:]}\n{logs}") from None
    effects = new.execute("SELECT key, count(*) FROM runs GROUP BY 1 HAVING count(*) > 1").fetchall()
    assert effects == [], f"an effect the new primary knows happened twice: {effects}"
    print(f"[{mode}] audit: {result.periods} periods, {result.jobs} jobs; in-flight re-run: "
          f"{sorted(in_flight)}")
    assert all(d.alive() for d in daemons) and all(w.poll() is None for w in workers)
    new.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-s", "-q"]))
