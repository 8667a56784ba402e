"""Handlers that the worker tests run (imported by the worker subprocesses via --import)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TypedDict

from cronkeeper.errors import PermanentError
from cronkeeper.worker import task


@task("noop")
def noop(payload, ctx):
    return None


@task("count")
def count(payload, ctx):
    """Counts its runs with the idempotency helper: one effect per job key."""
    time.sleep(float(payload.get("sleep", 0)))
    with ctx.effect(f"count:{ctx.key}") as first:
        if first:
            ctx.connection.exec_driver_sql(
                "INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)", {"k": ctx.key, "p": os.getpid()}
            )


@task("append_effect")
def append_effect(payload, ctx):
    """An effect outside the database, which no rollback can take back: one line per run
    (``key<TAB>attempt``) appended to ``$EFFECTS_LOG`` after the payload's ``sleep``."""
    time.sleep(float(payload.get("sleep", 0)))
    with open(os.environ["EFFECTS_LOG"], "a") as f:
        f.write(f"{ctx.key}\t{ctx.attempt}\n")


@task("log_runs")
def log_runs(payload, ctx):
    """Records every run (no idempotency guard), to count deliveries."""
    ctx.connection.exec_driver_sql(
        "INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)", {"k": f"{ctx.key}#{ctx.attempt}", "p": os.getpid()}
    )
    time.sleep(float(payload.get("sleep", 0)))


@task("failover_work")
def failover_work(payload, ctx):
    """Appends each run to ``$FAILOVER_RUN_LOG`` as it starts (what was executed), works in the
    job's transaction from the start (as a handler that reads and writes its rows throughout
    does), then claims its effect once in it (what took effect)."""
    path = os.environ.get("FAILOVER_RUN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{ctx.key}\t{ctx.attempt}\n")
    ctx.connection.exec_driver_sql("SELECT count(*) FROM runs")
    time.sleep(float(payload.get("sleep", 0)))
    with ctx.effect(f"fo:{ctx.key}") as first:
        if first:
            ctx.connection.exec_driver_sql(
                "INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)", {"k": ctx.key, "p": os.getpid()}
            )


@task("loses_its_connection")
def loses_its_connection(payload, ctx):
    """On its first attempt, the job's own database session is terminated from another one
    after the handler used it, as a PostgreSQL restart or a failover would: the handler returns
    normally, and the worker finds the connection gone when it commits the completion."""
    pid = ctx.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    if ctx.attempt == 1:
        with ctx.engine.connect() as other:
            other.exec_driver_sql("SELECT pg_terminate_backend(%(p)s)", {"p": pid})


class FlakyError(Exception):
    pass


@task("rollback_hook_fails")
def rollback_hook_fails(payload, ctx):
    """On its first attempt, works in the job's transaction, hooks a listener that raises into
    its rollback (an application's own audit hook, say) and fails: the worker's rollback of the
    job's transaction then raises an error that is not the driver's, while ending the job."""
    ctx.connection.exec_driver_sql("SELECT 1")
    if ctx.attempt == 1:
        import sqlalchemy as sa

        def refuse(conn):  # noqa: ANN001, ARG001
            raise RuntimeError("the audit hook refused the rollback")

        sa.event.listen(ctx.connection, "rollback", refuse)
        raise FlakyError("downstream returned 503")


@task("always_fails")
def always_fails(payload, ctx):
    raise FlakyError("downstream returned 503")


@task("permanent")
def permanent(payload, ctx):
    raise PermanentError("invoice 42 does not exist")


@task("fails_while_flagged")
def fails_while_flagged(payload, ctx):
    """Fails for good while the file ``payload["flag"]`` exists (a schedule that dies until
    someone fixes it), logging a line first (its output tail); succeeds once it is gone."""
    import logging

    if os.path.exists(payload["flag"]):
        logging.getLogger("billing").error("charging customer 42: card declined")
        raise PermanentError(f"flag {payload['flag']} is up")


@task("sleepy")
def sleepy(payload, ctx):
    time.sleep(float(payload.get("sleep", 60)))


@task("holds_its_transaction")
def holds_its_transaction(payload, ctx):
    """Notes in its job's transaction the instant it got a connection (table ``held``, made by
    the test), then keeps the transaction open for ``sleep`` seconds."""
    ctx.connection.exec_driver_sql(
        "INSERT INTO held (key, at) VALUES (%(k)s, clock_timestamp())", {"k": ctx.key})
    time.sleep(float(payload.get("sleep", 2)))


class InvoicePayload(TypedDict):
    invoice_id: int


@task("typed")
def typed(payload: InvoicePayload, ctx):
    return payload["invoice_id"]


@dataclass
class Page:
    cursor: int
    last: int


@task("paginate")
def paginate(payload: Page, ctx):
    """One page per job; the next page is enqueued atomically with this job's completion."""
    with ctx.effect(f"page:{payload.cursor}") as first:
        if first:
            ctx.connection.exec_driver_sql(
                "INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)",
                {"k": f"page:{payload.cursor}", "p": os.getpid()},
            )
    if payload.cursor < payload.last:
        ctx.enqueue("paginate", {"cursor": payload.cursor + 1, "last": payload.last},
                    key=f"page:{payload.cursor + 1}")


@task()
def by_path(payload, ctx):
    return None


def not_a_handler(payload, ctx):
    raise AssertionError("must never run: not marked with @task")


# -- helpers shared by the worker tests (not handlers) ------------------------------------------

def cronkeeper_exe() -> str:
    """The console script next to the interpreter running the tests."""
    import sys
    from pathlib import Path

    return str(Path(sys.executable).with_name("cronkeeper"))


def spawn_worker(database_url: str, schema: str, *args: str, cluster: str = "default",
                 env: dict | None = None):
    """A real ``cronkeeper worker`` process importing this module's handlers."""
    import subprocess
    import sys
    from pathlib import Path

    here = str(Path(__file__).parent)
    full_env = {**os.environ, "PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **(env or {})}
    argv = [cronkeeper_exe(), "worker", "--database-url", database_url, "--schema", schema,
            "--cluster", cluster, "--import", "handlers_for_tests", "--poll-interval", "0.1",
            "--log-level", "warning", *args]
    return subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True) if sys.platform else None


def wait_until(predicate, timeout: float = 30.0, interval: float = 0.05, message: str = ""):
    """``daemon_harness.wait_for`` with this module's older argument order (worker tests)."""
    from daemon_harness import wait_for

    return wait_for(predicate, timeout, message or "the condition", interval)


def _command_schedule_fixture():
    import json
    from pathlib import Path

    import pytest

    @pytest.fixture
    def command_schedule(engine, tmp_path):
        """Write a command schedule, record its version as the scheduler does, emit one job."""

        def make(argv, *, timeout="30s", max_attempts=5, payload=None, extra=""):
            from cronkeeper import clock
            from cronkeeper.schedule import load_valid

            root = Path(__file__).parent.parent
            argv = [str(root / a) if a.startswith("tests/bin/") else a for a in argv]
            directory = tmp_path / "schedules"
            directory.mkdir(mode=0o700, exist_ok=True)
            path = directory / "backup.toml"
            payload_toml = ", ".join(f"{k} = {json.dumps(v)}" for k, v in (payload or {}).items())
            path.write_text(
                "[backup]\nevery = \"1h\"\ntimezone = \"UTC\"\nmisfire = \"skip\"\n"
                f"command = {json.dumps(argv)}\ntimeout = \"{timeout}\"\nmax_attempts = {max_attempts}\n"
                f"payload = {{ {payload_toml} }}\n"
                "backoff = { base = \"0.1s\", factor = 2, max = \"1s\" }\nowner = \"team-test\"\n"
                + extra
            )
            path.chmod(0o600)
            spec = load_valid([str(directory)], now=clock.wall()).by_name()["backup"]
            with engine.begin() as conn:
                version = conn.exec_driver_sql(
                    "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
                    "VALUES ('backup', %(d)s, %(s)s, now() - interval '1 hour', 1) RETURNING id",
                    {"d": spec.digest, "s": json.dumps(spec.to_json())}).scalar()
                job = conn.exec_driver_sql(
                    "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, "
                    "payload, max_attempts, timeout_seconds, backoff) VALUES "
                    "('backup@2026-03-08T07:00:00Z', 'backup', '2026-03-08T07:00:00Z', %(v)s, "
                    "'command', %(p)s, %(m)s, %(t)s, %(b)s) RETURNING id",
                    {"v": version, "p": spec.payload_json, "m": spec.max_attempts, "t": spec.timeout,
                     "b": json.dumps({"base": spec.backoff.base, "factor": spec.backoff.factor,
                                      "max": spec.backoff.max})}).scalar()
            return str(directory), job

        return make

    return command_schedule


command_schedule = _command_schedule_fixture()


def q(engine, sql, **params):
    """The rows of one statement: the worker tests' shorthand for reading what happened."""
    with engine.connect() as conn:
        return conn.exec_driver_sql(sql, params).all()


def _worker_fixtures():
    import pytest

    @pytest.fixture
    def runs(engine):
        """A table the ``count`` handlers write a row into per run (key, the runner's pid)."""
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE runs (key text NOT NULL, pid integer NOT NULL)")
        return engine

    @pytest.fixture
    def spawned_workers(database_url, schema):
        """``start(*args)``: a real worker process; those still running are killed afterwards."""
        procs = []

        def start(*args: str):
            proc = spawn_worker(database_url, schema, *args)
            procs.append(proc)
            return proc

        yield start
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)

    return runs, spawned_workers


runs, spawned_workers = _worker_fixtures()


@task("tests.write_file")
def write_file(payload, ctx):
    """Leaves a file at ``payload["path"]``: proof that the handler started."""
    with open(payload["path"], "w") as f:
        f.write(ctx.key)
