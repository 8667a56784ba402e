"""Helpers for the relay tests: configs, a relay in a thread or a process, the shared RabbitMQ
(a queue of each test's own, deleted afterwards), a private Redis they may stop and restart (the
shared one on 6379 is never flushed, stopped or restarted), relay jobs built as the relay
builds them, and the targets' real consumers (Sidekiq, a Node BullMQ worker, rq worker). Waits
go through ``daemon_harness.wait_for`` (re-exported here)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from daemon_harness import wait_for  # noqa: F401 - re-exported for the relay tests

from cronkeeper.relay.targets.base import RelayJob

AMQP_URL = os.environ.get("CRONKEEPER_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("CRONKEEPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
HERE = Path(__file__).parent


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def write_config(tmp_path: Path, body: str, name: str = "relay.toml") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def celery_config(broker: str, *, queue: str, tasks: str = '["billing.*"]', extra: str = "",
                  target_extra: str = "", name: str | None = None, lease: str = "15s") -> str:
    return f"""
name = "{name or unique('relay')}"
lease = "{lease}"
poll_interval = "0.05s"
status_interval = "0.2s"
{extra}

[targets.celery-main]
kind = "celery"
broker = "{broker}"
{target_extra}

[[routes]]
tasks = {tasks}
target = "celery-main"
queue = "{queue}"
"""


class RelayThread:
    """An in-process relay (same code as ``cronkeeper relay``), stopped at teardown."""

    def __init__(self, engine, schema: str, config_path: str, relay_id: str | None = None) -> None:
        from cronkeeper.cli.relay import build_targets, load_config
        from cronkeeper.relay.loop import Relay

        config = load_config(config_path)
        self.relay = Relay(engine, config, build_targets(config),
                           relay_id=relay_id or unique("relay"), schema=schema)
        self.thread = threading.Thread(target=self.relay.run, daemon=True)

    def __enter__(self) -> RelayThread:
        self.thread.start()
        assert self.relay.registered.wait(30), "the relay did not register its routes"
        return self

    def __exit__(self, *exc: object) -> None:
        self.relay.stop()
        self.thread.join(30)


def spawn_relay(database_url: str, schema: str, config_path: str, *, env: dict | None = None,
                relay_id: str | None = None, kill_after_publish: int = 0) -> subprocess.Popen:
    """A real ``cronkeeper relay`` process; ``kill_after_publish=N``: it SIGKILLs itself once N
    jobs are published and before they are marked (tests/crash_site)."""
    from handlers_for_tests import cronkeeper_exe

    path = [str(HERE / "crash_site")] if kill_after_publish else []
    path += [str(HERE), os.environ.get("PYTHONPATH", "")]
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **(env or {})}
    if kill_after_publish:
        full_env["CRONKEEPER_TEST_RELAY_KILL_AFTER_PUBLISH"] = str(kill_after_publish)
    argv = [cronkeeper_exe(), "relay", "--database-url", database_url, "--schema", schema,
            "--config", config_path, "--metrics-address", "off", "--log-level", "info",
            "--instance-id", relay_id or unique("relay")]
    return subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)


def stop(proc: subprocess.Popen, timeout: float = 20) -> str:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    out, err = proc.communicate()
    return (out or "") + (err or "")


def drain_amqp(queue: str, *, expect: int, timeout: float = 30.0) -> list[tuple[dict, object]]:
    """Consume (and ack) messages from a RabbitMQ queue until ``expect`` arrived or the
    timeout; returns (headers, decoded body) of each."""
    from kombu import Connection

    got: list[tuple[dict, object]] = []
    deadline = time.monotonic() + timeout
    with Connection(AMQP_URL) as conn:
        q = conn.SimpleQueue(queue)
        try:
            while len(got) < expect and time.monotonic() < deadline:
                try:
                    msg = q.get(block=True, timeout=0.5)
                except q.Empty:
                    continue
                got.append((dict(msg.headers), msg.decode()))
                msg.ack()
            # anything beyond the expected count is a duplicate the test must see
            while True:
                try:
                    msg = q.get(block=True, timeout=0.3)
                except q.Empty:
                    break
                got.append((dict(msg.headers), msg.decode()))
                msg.ack()
        finally:
            q.close()
    return got


def delete_amqp_queue(queue: str) -> None:
    from kombu import Connection, Queue

    try:
        with Connection(AMQP_URL) as conn:
            Queue(queue, channel=conn.default_channel).delete()
    except Exception:  # noqa: BLE001 - cleanup only
        pass


def put(engine, schema: str, task: str, payload: dict, *, key: str, **kwargs) -> int | None:
    """One job, committed (cronkeeper.enqueue in its own transaction)."""
    import cronkeeper

    with engine.begin() as conn:
        return cronkeeper.enqueue(conn, task, payload, key=key, schema=schema, **kwargs)


CELERY_TABLES = """
CREATE TABLE celery_deliveries (n serial PRIMARY KEY, task_id text, key_header text,
    schedule_header text, scheduled_for_header text, started_at timestamptz, finished_at timestamptz);
CREATE TABLE task_effects (key text PRIMARY KEY);
CREATE TABLE invoices_sent (key text PRIMARY KEY, payload jsonb);
"""


def create_celery_tables(engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(CELERY_TABLES)


def spawn_celery_worker(database_url: str, schema: str, queue: str, *, broker: str = AMQP_URL,
                        backend: str | None = None, env: dict | None = None) -> subprocess.Popen:
    """A real ``celery worker`` process (solo pool) running tests/celery_app_for_tests.py."""
    import sys

    full_env = {**os.environ, **celery_env(database_url, schema, queue, broker=broker,
                                           backend=backend), **(env or {})}
    argv = [sys.executable, "-m", "celery", "-A", "celery_app_for_tests", "worker", "-Q", queue,
            "-P", "solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-l", "WARNING", "-n", f"{queue}@%h"]
    return subprocess.Popen(argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, cwd=str(HERE))


def celery_env(database_url: str, schema: str, queue: str, *, broker: str = AMQP_URL,
               backend: str | None = None) -> dict[str, str]:
    """What tests/celery_app_for_tests.py reads (for the worker, and a relay loading the app)."""
    from conftest import libpq_url

    return {
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "CK_TEST_BROKER": broker, "CK_TEST_BACKEND": backend or "", "CK_TEST_QUEUE": queue,
        "CK_TEST_DB_URL": libpq_url(database_url), "CK_TEST_SCHEMA": schema,
    }


class TcpProxy:
    """A loopback TCP proxy in front of a broker that a test can cut (every connection dropped,
    new ones closed at once: the broker looks down) and restore, without touching the shared
    broker itself."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        import socket

        self.target = (host, port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self.up = True
        self.closed = False
        self.hold_replies = False  # broker -> client bytes wait (the broker "stops answering")
        self.drip = 0.0  # > 0: broker -> client bytes go one at a time, this many seconds apart
        self._socks: list = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket

        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            for a, b, replies in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pump, args=(a, b, replies), daemon=True).start()

    def _pump(self, src, dst, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while replies and self.hold_replies and not self.closed:
                    time.sleep(0.01)
                while replies and self.drip > 0 and data and not self.closed:
                    dst.sendall(data[:1])  # every read the client makes gets one byte, in time
                    data = data[1:]
                    time.sleep(self.drip)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.close()

    def cut(self) -> None:
        import socket

        self.up = False
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def restore(self) -> None:
        self.up = True

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.listener.close()


TESTS = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server of this test's own on a free loopback port, without persistence, so a
    restart loses exactly what a crashed Redis without AOF loses."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which("redis-server") is None:
            pytest.fail("redis-server is not installed: run scripts/test-deps.sh", pytrace=False)
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        wait_for(lambda: _pings(client), 30, "private redis-server to answer")
        client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def relay_job(schedule: str, n: int, *, task: str = "relay_consumers.record",
              payload: dict | None = None, run_after: datetime | None = None,
              timeout: float = 30.0) -> RelayJob:
    """A job as the relay hands it to a target: period ``n`` of ``schedule``."""
    base = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    scheduled_for = base + timedelta(minutes=n)
    key = f"{schedule}@{scheduled_for:%Y-%m-%dT%H:%M:%SZ}"
    now = datetime.now(UTC)
    return RelayJob(
        id=n, key=key, schedule=schedule, scheduled_for=scheduled_for, task=task,
        payload=payload if payload is not None else {"n": n}, attempt=1, max_attempts=5,
        timeout=timeout, run_after=run_after or now, created_at=now,
    )


def effects(path: Path) -> list[str]:
    """Lines the consumers appended (one per run)."""
    return path.read_text().splitlines() if path.exists() else []


def consumer_env(effects_file: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS / "relay"), env.get("PYTHONPATH", "")])
    env["RELAY_EFFECTS"] = str(effects_file)
    env.update(extra)
    return env


# -- real consumers --------------------------------------------------------------------------

SIDEKIQ_APP = TESTS / "relay" / "sidekiq_app.rb"
NODE = TESTS / "node"
RQ = str(Path(sys.executable).with_name("rq"))


class SidekiqServer:
    def __init__(self, url: str, queue: str, effects_file, middleware: bool) -> None:
        if shutil.which("sidekiq") is None:
            pytest.fail("sidekiq is not installed: run scripts/test-deps.sh (ruby-sidekiq)",
                        pytrace=False)
        self.log = effects_file.with_suffix(".log")
        env = consumer_env(effects_file, REDIS_URL=url,
                           CRONKEEPER_MIDDLEWARE="1" if middleware else "0")
        self.proc = subprocess.Popen(
            ["sidekiq", "-r", str(SIDEKIQ_APP), "-q", queue, "-c", "3", "-t", "5"],
            env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        stop_process(self.proc)


class NodeWorker:
    def __init__(self, url: str, queue: str, prefix: str, effects_file,
                 starts_file=None) -> None:
        if shutil.which("node") is None or not (NODE / "node_modules" / "bullmq").is_dir():
            pytest.fail("node and tests/node/node_modules are needed: run scripts/test-deps.sh",
                        pytrace=False)
        self.log = Path(effects_file).with_suffix(".node.log")
        self.proc = subprocess.Popen(
            ["node", str(NODE / "bullmq_worker.mjs"), url, queue, prefix, str(effects_file),
             *([str(starts_file)] if starts_file else [])],
            stdout=subprocess.PIPE, stderr=self.log.open("a"), text=True,
        )
        line = self.proc.stdout.readline()  # "ready"; nothing else is printed on stdout
        assert line.strip() == "ready", self.log.read_text()[-2000:]

    def stop(self) -> None:
        stop_process(self.proc)


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def rq_worker(url: str, queue: str, effects_file: Path, *, burst: bool) -> subprocess.Popen:
    """A real ``rq worker`` (JSON serializer, the scheduler on) running tests/relay handlers."""
    cmd = [RQ, "worker", "--url", url, "--serializer", "rq.serializers.JSONSerializer",
           "--worker-class", "rq.worker.SimpleWorker", "--with-scheduler", queue]
    if burst:
        cmd.insert(2, "--burst")
        return subprocess.Popen(cmd, env=consumer_env(effects_file), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
    log = Path(effects_file).with_suffix(".rq.log").open("a")
    return subprocess.Popen(cmd, env=consumer_env(effects_file), stdout=log, stderr=log)
