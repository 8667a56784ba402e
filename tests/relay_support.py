"""What the relay-target tests share: a private Redis they may stop and restart (the shared one
on 6379 is never flushed, stopped or restarted), relay jobs built like the relay builds them,
and a wait-for-a-condition helper (no timing thresholds: a deadline only bounds the wait)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
from relay_helpers import unique as unique_name  # noqa: F401 - re-exported for the tests

from cronkeeper.relay.targets.base import RelayJob

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


def wait_for(condition: Callable[[], object], timeout: float, what: str, proc=None):
    """Poll ``condition`` until truthy; fail with ``what`` when the deadline passes or ``proc``
    (a consumer subprocess) died."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"consumer exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


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
