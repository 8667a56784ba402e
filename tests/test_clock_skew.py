"""A wrong clock (SPEC §6, §10): real processes under libfaketime (Debian's ``faketime``).

- A daemon and a worker whose clocks are an hour behind, or an hour ahead, fire every period of
  an every-second schedule once, at the database's instants, and run every job; each measures its
  skew (the ``instances`` row, the metric) and ``status`` shows it, in text and JSON.
- A leader whose clock jumps an hour forward, then back, while it leads keeps its term and
  decides every period exactly once, around each jump too.
- A worker whose clock jumps while a command runs neither times it out early nor lets it run on:
  job timeouts and leases are paced by the monotonic clock, which a clock step leaves alone.
- A relay an hour behind hands a due job to RQ's queue at once, not to RQ's scheduler.
- PostgreSQL's own clock steps (a private server under libfaketime): a step forward makes the
  skipped instants due at once, each decided once; a step back makes the leader wait for the
  instants it has already decided, and none is decided twice.

The wall clock is faked, the monotonic clock is not (``FAKETIME_DONT_FAKE_MONOTONIC=1``): that
is what a VM's clock step does. Jumps rewrite the file libfaketime reads its offset from
(``FAKETIME_TIMESTAMP_FILE``, re-read on every clock read with ``FAKETIME_NO_CACHE=1``). Each
step is confirmed by what the process itself reports (its measured skew) before the test goes
on, never by a sleep.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from daemon_harness import (
    CRONKEEPER,
    Daemon,
    PrivatePostgres,
    _free_port,
    assert_audit_clean,
    audit,
    db_now,
    leader_row,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)
from faults import faked_daemon, faked_env, set_offset
from handlers_for_tests import q, spawn_worker
from relay_helpers import private_redis, put, spawn_relay, stop, unique, write_config  # noqa: F401 - private_redis is a fixture
from test_relay_rq import relay_config

HOUR = 3600.0
SKEW_TOLERANCE = 5.0  # seconds: the measured skew is an hour give or take a heartbeat's latency
LATE_BOUND = 30.0  # seconds: a job created this late (or decided) is not an hour late either
EVERY_SECOND = {"tick.toml": schedule_toml("tick", every="1s", task="noop")}


def skews(db: psycopg.Connection, cluster: str) -> dict[str, float | None]:
    return dict(db.execute("SELECT instance_id, clock_skew_seconds FROM instances "
                           "WHERE cluster = %s", (cluster,)).fetchall())


def skew_near(db: psycopg.Connection, cluster: str, instance_id: str, expected: float) -> bool:
    value = skews(db, cluster).get(instance_id)
    return value is not None and abs(value - expected) < SKEW_TOLERANCE


def periods(db: psycopg.Connection) -> list[tuple[datetime, str, datetime, int]]:
    return db.execute("SELECT scheduled_for, outcome, decided_at, term FROM periods "
                      "WHERE schedule = 'tick' ORDER BY scheduled_for").fetchall()


def q_unfinished(db: psycopg.Connection, cutoff: datetime) -> list[tuple[Any, ...]]:
    return db.execute("SELECT id, state FROM outbox WHERE scheduled_for <= %s "
                      "AND state <> 'succeeded'", (cutoff,)).fetchall()


def assert_contiguous(instants: list[datetime], context: str) -> None:
    """Every second from the first to the last, each once (the audit checks against the spec;
    this also says which instants were lost or doubled, in a readable message)."""
    gaps = [(a, b) for a, b in zip(instants, instants[1:], strict=False)
            if b - a != timedelta(seconds=1)]
    assert not gaps, f"{context}: instants not one second apart: {gaps[:5]}"
    assert all(p.microsecond == 0 for p in instants), f"{context}: not on whole seconds"


def status(url: str, schema: str, cluster: str, *fmt: str) -> str:
    result = subprocess.run([CRONKEEPER, "status", "--database-url", url, "--schema", schema,
                             "--cluster", cluster, *fmt], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def scrape(port: int, name: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def stop_worker(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.terminate()
    try:
        _, err = proc.communicate(timeout=40)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    return err or ""


# -- a VM clock an hour wrong --------------------------------------------------------------------
@pytest.mark.parametrize("offset, skew", [("-1h", HOUR), ("+1h", -HOUR)],
                         ids=["an-hour-behind", "an-hour-ahead"])
def test_an_hour_wrong_clock_fires_at_the_databases_instants(tmp_path, offset, skew):
    pg = shared_postgres()
    schema = pg.new_schema()
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    env = faked_env(offset=offset)
    schedules = write_schedules(tmp_path / "schedules", EVERY_SECOND)
    d_port, w_port = _free_port(), _free_port()
    daemon = Daemon(url=pg.url, schema=schema, cluster=cluster, schedules=schedules,
                    instance_id="skewed-leader", log_dir=tmp_path)
    daemon.argv[daemon.argv.index("--metrics-address") + 1] = f"127.0.0.1:{d_port}"
    faked_daemon(daemon, env)
    db = set_path(pg.connect(), schema)
    worker = None
    try:
        started = db_now(db)
        daemon.start()
        worker = spawn_worker(pg.url, schema, "--instance-id", "skewed-worker",
                              "--metrics-address", f"127.0.0.1:{w_port}", cluster=cluster, env=env)
        # the processes really run an hour off: each measures it against the database's clock
        for who in ("skewed-leader", "skewed-worker"):
            wait_for(lambda who=who: skew_near(db, cluster, who, skew), 30,
                     f"{who} to measure a skew of {skew:+.0f}s")
        wait_for(lambda: len(periods(db)) >= 8, 40, "eight periods decided")
        cutoff = db_now(db) - timedelta(seconds=1)
        wait_for(lambda: not q_unfinished(db, cutoff), 30, "every job due by now to succeed")

        rows = periods(db)
        instants = [p for p, *_ in rows]
        assert_contiguous(instants, offset)
        # the database's instants: within the run by its clock, not an hour off it
        assert started - timedelta(seconds=1) <= instants[0] <= cutoff + timedelta(seconds=2)
        assert instants[-1] <= db_now(db)
        assert all(outcome == "emitted" for _, outcome, _, _ in rows), rows
        jobs = db.execute("SELECT scheduled_for, created_at, state, attempts FROM outbox "
                          "WHERE scheduled_for <= %s ORDER BY scheduled_for", (cutoff,)).fetchall()
        assert jobs, "no job was created"
        for scheduled_for, created_at, state, attempts in jobs:
            late = (created_at - scheduled_for).total_seconds()
            assert 0 <= late < LATE_BOUND, (scheduled_for, created_at)  # by the database's clock
            assert (state, attempts) == ("succeeded", 1), (scheduled_for, state, attempts)
        assert_audit_clean(db, context=offset)

        measured = skews(db, cluster)
        assert abs(measured["skewed-leader"] - skew) < SKEW_TOLERANCE, measured
        assert abs(measured["skewed-worker"] - skew) < SKEW_TOLERANCE, measured
        for port in (d_port, w_port):
            exported = wait_for(lambda port=port: scrape(port, "cronkeeper_clock_skew_seconds"),
                                20, f"the skew metric on :{port}")
            assert abs(exported - skew) < SKEW_TOLERANCE, (port, exported)

        doc = json.loads(status(pg.url, schema, cluster, "--format", "json"))
        shown = {i["instance_id"]: i["clock_skew_seconds"] for i in doc["instances"]}
        assert abs(shown["skewed-leader"] - skew) < SKEW_TOLERANCE, shown
        assert abs(shown["skewed-worker"] - skew) < SKEW_TOLERANCE, shown
        word = "behind" if skew > 0 else "ahead of"
        said = [d for d in doc["diagnosis"] if d.startswith("clock skew:")]
        assert len(said) == 2 and all(f"s {word} the database's clock" in d for d in said), said
        text = status(pg.url, schema, cluster)
        assert "SKEW" in text
        for who in ("skewed-leader", "skewed-worker"):  # the instances table's SKEW column
            row = next(line for line in text.splitlines() if line.startswith(f"  {who} "))
            shown_skew = row.split()[-1]
            assert shown_skew.endswith("s") and abs(float(shown_skew[:-1]) - skew) < SKEW_TOLERANCE, text
        assert "clock skew: skewed-leader" in text, text
    except AssertionError as exc:
        err = stop_worker(worker) if worker is not None else ""
        raise AssertionError(f"{exc}\n--- daemon\n{daemon.log_text()[-3000:]}\n--- worker\n"
                             f"{err[-2000:]}") from None
    finally:
        if worker is not None:
            stop_worker(worker)
        daemon.kill()
        db.close()


# -- a leader whose clock jumps ----------------------------------------------------------------------
def test_a_leader_whose_clock_jumps_decides_each_period_once(tmp_path):
    pg = shared_postgres()
    schema = pg.new_schema()
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    offset = tmp_path / "clock-offset"
    set_offset(offset, "+0")
    schedules = write_schedules(tmp_path / "schedules", EVERY_SECOND)
    daemon = faked_daemon(Daemon(url=pg.url, schema=schema, cluster=cluster, schedules=schedules,
                                 instance_id="jumpy", log_dir=tmp_path), faked_env(file=offset))
    db = set_path(pg.connect(), schema)
    try:
        daemon.start()
        wait_for(lambda: leader_row(db, cluster), 30, "jumpy to lead")
        wait_for(lambda: len(periods(db)) >= 3, 30, "periods before the jumps")
        term = leader_row(db, cluster).term
        marks = []
        for step, skew in (("+1h", -HOUR), ("+0", 0.0), ("-1h", HOUR), ("+0", 0.0)):
            set_offset(offset, step)
            wait_for(lambda skew=skew: skew_near(db, cluster, "jumpy", skew), 20,
                     f"jumpy's clock to step to {step}")
            marks.append(db_now(db))
            # some periods decided on this side of the step, by the database's clock
            wait_for(lambda at=marks[-1]: sum(p > at for p, *_ in periods(db)) >= 3, 20,
                     f"periods after the step to {step}")
        assert_audit_clean(db, margin=1.5, context="across the clock jumps")
        rows = periods(db)
        assert_contiguous([p for p, *_ in rows], "across the clock jumps")
        assert all(outcome == "emitted" for _, outcome, _, _ in rows), rows
        # decided on time by the database's clock on each side of every step: never before its
        # instant (a leader planning by its own clock an hour ahead would), never an hour late
        early = [(p, d) for p, _, d, _ in rows if d < p]
        assert not early, f"decided before their instants: {early[:5]} ({len(early)} in all)"
        late = [(p, (d - p).total_seconds()) for p, _, d, _ in rows if (d - p).total_seconds() > LATE_BOUND]
        assert not late, late
        assert rows[-1][0] <= db_now(db)
        # one term throughout: the steps neither stalled the leader nor made it step down
        assert {t for *_, t in rows} == {term}, rows
        assert leader_row(db, cluster).term == term
        said = {r.get("action") for r in daemon.records()}
        assert not said & {"leader_stalled", "leader_lost", "leader_deposed"}, said
        assert daemon.alive()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- daemon\n{daemon.log_text()[-4000:]}") from None
    finally:
        daemon.kill()
        db.close()


# -- a worker whose clock jumps while a command runs ------------------------------------------------
@pytest.mark.parametrize("step, skew", [("+1h", -HOUR), ("-1h", HOUR)], ids=["forward", "back"])
@pytest.mark.parametrize("sleep, timeout, ends", [(3, 5, "succeeded"), (60, 3, "timeout")],
                         ids=["within-its-timeout", "past-its-timeout"])
def test_a_clock_step_neither_times_out_nor_prolongs_a_running_command(
        engine, schema, database_url, tmp_path, command_schedule, step, skew, sleep, timeout, ends):
    """The worker's clock steps an hour while a command runs: one that sleeps 3 s under a 5 s
    timeout still succeeds on its first attempt (a forward step does not time it out early, nor
    let its lease lapse); one that would sleep a minute under a 3 s timeout is still killed at
    3 s (a backward step does not let it run on)."""
    offset = tmp_path / "clock-offset"
    set_offset(offset, "+0")
    marker = tmp_path / "started"
    argv = ["/bin/sh", "-c", f"touch {marker}; exec sleep {sleep}"]
    schedules, job = command_schedule(argv, timeout=f"{timeout}s", max_attempts=1)
    worker_id = f"w-{uuid.uuid4().hex[:6]}"
    proc = spawn_worker(database_url, schema, "--schedules", schedules, "--instance-id", worker_id,
                        "--lease-margin", "1", "--kill-grace", "0.5", "--metrics-address", "off",
                        env=faked_env(file=offset))
    try:
        wait_for(marker.exists, 30, "the command to start")
        set_offset(offset, step)
        wait_for(lambda: skew_near_engine(engine, worker_id, skew), 10,
                 f"the worker's clock to step {step} while the command runs")
        assert state_of(engine, job)[0] == "running"  # the step came while it ran
        wait_for(lambda: state_of(engine, job)[0] in ("succeeded", "dead", "available"), 30,
                 "the command to end")
        state, attempts, error = state_of(engine, job)
        expected_state = "succeeded" if ends == "succeeded" else "dead"
        assert (state, attempts) == (expected_state, 1), (state, attempts, error)
        ((outcome, seconds),) = q(engine, "SELECT outcome, extract(epoch FROM finished_at - "
                                          "started_at)::float8 FROM attempts WHERE job_id = %(j)s", j=job)
        assert outcome == ends, (outcome, error)
        # by the database's clock: it ran its 3 s and ended before its timeout; or it was
        # killed at its timeout, nowhere near the minute it asked for (let alone an hour)
        if ends == "succeeded":
            assert sleep <= seconds < timeout, seconds
        else:
            assert timeout <= seconds < sleep / 2, seconds
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- worker\n{stop_worker(proc)[-3000:]}") from None
    finally:
        stop_worker(proc)


def state_of(engine: Any, job: int) -> tuple[Any, ...]:
    return tuple(q(engine, "SELECT state, attempts, last_error FROM outbox WHERE id = %(i)s", i=job)[0])


def skew_near_engine(engine: Any, instance_id: str, expected: float) -> bool:
    rows = q(engine, "SELECT clock_skew_seconds FROM instances WHERE instance_id = %(i)s", i=instance_id)
    return bool(rows) and rows[0][0] is not None and abs(rows[0][0] - expected) < SKEW_TOLERANCE


# -- a relay whose clock is behind ---------------------------------------------------------------------
def test_a_relay_an_hour_behind_publishes_a_due_job_at_once(
        engine, schema, database_url, private_redis, tmp_path):  # noqa: F811
    """A job the database holds due is due: a relay whose clock is an hour behind hands it to
    RQ's queue at once, not to RQ's scheduler for an hour later (as judging ``run_after`` by its
    own clock would; BullMQ's relative ``delay`` would hold it back that hour, too)."""
    queue = unique("rq")
    config = write_config(tmp_path, relay_config(private_redis.url, queue))
    relay_id = f"relay-{uuid.uuid4().hex[:6]}"
    proc = spawn_relay(database_url, schema, config, relay_id=relay_id, env=faked_env(offset="-1h"))
    try:
        wait_for(lambda: skew_near_engine(engine, relay_id, HOUR), 30,
                 "the relay to measure its skew of +3600s")
        put(engine, schema, "relay_consumers.record", {"n": 1}, key="behind@2026-12-01T00:00:00Z")
        wait_for(lambda: q(engine, "SELECT state FROM outbox")[0][0] == "published", 30,
                 "the job to be published")
        client = private_redis.client()
        assert client.zcard(f"rq:scheduled:{queue}") == 0, "held back in RQ's scheduler"
        assert client.llen(f"rq:queue:{queue}") == 1
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- relay\n{stop(proc)[-3000:]}") from None
    finally:
        stop(proc)


# -- the database's own clock steps ----------------------------------------------------------------
@contextmanager
def environ(extra: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def db_offset(db: psycopg.Connection) -> float:
    """The database's clock minus this (unfaked) process's, in seconds."""
    before = datetime.now(UTC)
    theirs = db_now(db)
    after = datetime.now(UTC)
    return (theirs - (before + (after - before) / 2)).total_seconds()


STEP = 30  # seconds PostgreSQL's clock steps, forward then back (as NTP stepping it would)


def test_the_databases_own_clock_steps_forward_then_back(tmp_path):
    server = PrivatePostgres()
    offset = server.root / "clock-offset"  # readable by the server's OS user (tmp_path is not)
    set_offset(offset, "+0")
    schedules = write_schedules(tmp_path / "schedules", {"tick.toml": schedule_toml(
        "tick", every="1s", misfire="catch_up", catch_up_limit="1h", task="noop")})
    daemons: list[Daemon] = []
    db = None
    try:
        with environ(faked_env(file=offset) | {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}):
            server.start()
        schema = server.new_schema()
        cluster = f"c-{uuid.uuid4().hex[:8]}"
        db = set_path(server.connect(), schema)
        assert abs(db_offset(db)) < SKEW_TOLERANCE
        daemons = [Daemon(url=server.url, schema=schema, cluster=cluster, schedules=schedules,
                          instance_id=f"node{i}", log_dir=tmp_path).start() for i in range(2)]
        wait_for(lambda: len(periods(db)) >= 3, 40, "periods before the step")

        # forward: the instants the step skips are due at once, each decided once (catch_up)
        before = max(p for p, *_ in periods(db))
        set_offset(offset, f"+{STEP}s")
        wait_for(lambda: abs(db_offset(db) - STEP) < SKEW_TOLERANCE, 20,
                 f"PostgreSQL's clock to step {STEP}s forward")
        stepped = db_now(db)
        wait_for(lambda: max(p for p, *_ in periods(db)) >= stepped, 30,
                 "the skipped instants to be decided")
        high = max(p for p, *_ in periods(db))
        skipped = [r for r in periods(db) if before < r[0] < stepped - timedelta(seconds=2)]
        assert len(skipped) >= STEP - 3, skipped
        assert all(outcome == "emitted" for _, outcome, _, _ in skipped), skipped

        # back: the leader waits for the instants it already decided, and decides none twice
        set_offset(offset, "+0")
        wait_for(lambda: abs(db_offset(db)) < SKEW_TOLERANCE, 20,
                 f"PostgreSQL's clock to step {STEP}s back")
        back = db_now(db)
        assert back < high  # the database's now is before instants it has already decided
        wait_for(lambda: db_now(db) > high + timedelta(seconds=4), STEP + 20,
                 "the database's clock to pass the last instant decided before the step back")
        wait_for(lambda: not audit(db, margin=1.5).missing, 20, "every due period decided")
        assert_audit_clean(db, margin=1.5, context="across the database's clock steps")
        rows = periods(db)
        assert_contiguous([p for p, *_ in rows], "across the database's clock steps")
        # never decided ahead of its instant by the database's clock at the decision
        early = [(p, d) for p, _, d, _ in rows if d < p]
        assert not early, early
        # after the step back, nothing new was decided until the clock reached new instants
        assert all(d >= p for p, _, d, _ in rows if p > high), rows
    except AssertionError as exc:
        logs = "\n".join(f"--- {d.instance_id}\n{d.log_text()[-3000:]}" for d in daemons)
        raise AssertionError(f"{exc}\n{logs}") from None
    finally:
        for d in daemons:
            d.kill()
        if db is not None:
            db.close()
        server.stop()
