"""The processes of ``scripts/soak.py``: a ``cronkeeper worker`` it can kill, freeze and
restart under the same id, and the application that enqueues jobs with its own orders."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
from pathlib import Path

import psycopg
from daemon_harness import CRONKEEPER, set_path

import cronkeeper
from cronkeeper.errors import DatabaseError

HERE = Path(__file__).resolve().parent


def isolation_supported() -> bool:
    out = subprocess.run([CRONKEEPER, "worker", "--help"], capture_output=True, text=True)
    return "--isolation" in out.stdout


class WorkerProc:
    """One ``cronkeeper worker`` process, restartable under the same id, JSON log in a file."""

    def __init__(self, url: str, schema: str, cluster: str, instance_id: str, isolation: str,
                 workdir: Path) -> None:
        self.instance_id = instance_id
        self.isolation = isolation
        self.log_path = workdir / f"{instance_id}.log"
        self.argv = [CRONKEEPER, "worker", "--database-url", url, "--schema", schema,
                     "--cluster", cluster, "--import", "soak_handlers", "--concurrency", "6",
                     "--poll-interval", "0.2", "--lease-margin", "2", "--drain-timeout", "5",
                     "--metrics-address", "off", "--log-format", "json"]
        if isolation != "thread" or isolation_supported():
            self.argv += ["--isolation", isolation]
        self.env = {**os.environ, "PYTHONPATH": str(HERE), "CRONKEEPER_INSTANCE_ID": instance_id,
                    "SOAK_RUN_LOG": str(workdir)}
        self.proc: subprocess.Popen | None = None

    def start(self) -> WorkerProc:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.killpg(self.pid, sig)  # the worker and its handler processes: a frozen host

    def kill(self) -> None:
        """SIGKILL of the worker process alone (its handler children must notice by themselves)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


class Application(threading.Thread):
    """Enqueues jobs in its own transactions, each with the business row that needs it (the
    outbox pattern): ``app_orders`` and the job commit together or not at all. Talks to
    PostgreSQL directly and survives its restarts by reconnecting."""

    def __init__(self, url: str, schema: str, rate: float, rng: random.Random) -> None:
        super().__init__(daemon=True, name="application")
        self.url, self.schema, self.rate, self.rng = url, schema, rate, rng
        self.stopping = threading.Event()
        self.committed = 0
        self.failed = 0

    def run(self) -> None:
        seq = 0
        conn: psycopg.Connection | None = None
        while not self.stopping.wait(1.0 / self.rate):
            seq += 1
            key = f"app:{seq}"
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, connect_timeout=5)
                    set_path(conn, self.schema)
                    conn.commit()
                with conn.transaction():
                    conn.execute("INSERT INTO app_orders (key) VALUES (%s)", (key,))
                    chain = 2 if self.rng.random() < 0.1 else 0
                    cronkeeper.enqueue(conn, "soak.work", {"sleep": 0.5, "chain": chain, "hang": 5},
                                       key=key, schema=self.schema, timeout=2.0, max_attempts=4,
                                       backoff={"base": 0.3, "factor": 2, "max": 2})
                self.committed += 1
            except (psycopg.Error, DatabaseError):  # DatabaseError: cronkeeper.enqueue's own
                self.failed += 1  # the order and its job were both rolled back (or both kept)
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()
