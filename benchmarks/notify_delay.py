"""Notification delivery delay: from a job's dead-lettering to its notification arriving at a
webhook receiver on loopback, over a few hundred dead letters of distinct schedules (each one a
`dead` notification: docs/notifications.md).

    .venv/bin/python benchmarks/notify_delay.py --dead 300 \\
        --database-url postgresql://postgres@127.0.0.1:5432/test

``--senders`` ``cronkeeper worker`` processes run at their defaults with a notify config whose
one rule sends every event to the receiver (a threaded HTTP server in this process). Each job
is an outbox row of its own schedule (``bench-N``) whose task fails for good, so the worker
dead-letters it after one attempt, noting the notification in that statement, and a sender
delivers it. Two rounds in one run: ``spaced`` (one job every ``--gap`` seconds: the delay of a
dead letter when nothing else is being told) and ``burst`` (all at once: a database-wide
failure, every schedule dying together; the senders work off the queue one notification at a
time each). The delay is the receiver's clock at arrival minus the job's ``finished_at`` (the
database clock of the statement that dead-lettered it; database and receiver share this
machine's clock). Prints p50, p99 and max for each round, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
SCHEMA = "bench_notify"

try:  # the handler: imported by `cronkeeper worker --import notify_delay`
    from cronkeeper.errors import PermanentError
    from cronkeeper.worker import task as _task

    @_task("bench.dies")
    def bench_dies(payload, ctx):  # noqa: ANN001, ARG001
        raise PermanentError("the downstream says no")
except ImportError:  # pragma: no cover
    pass


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


class Receiver:
    """A webhook receiver: the arrival time of each notification, by its key."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.count = 0
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                at = time.time()
                doc = json.loads(body)
                with lock:
                    receiver.count += 1
                    receiver.arrived.setdefault(doc["key"], at)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook"


def fresh_schema(url: str) -> None:
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.migrate import migrate

    with psycopg.connect(plain(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    engine = make_engine(normalize_url(url), "public", pool_size=1)
    migrate(engine, SCHEMA)
    engine.dispose()


def start_workers(url: str, count: int, config: Path) -> list[subprocess.Popen]:
    """The workers, their logs (a dead letter is an error line each) in the config's folder."""
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    procs = []
    for i in range(count):
        with open(config.parent / f"worker-{i}.log", "w") as log:
            procs.append(subprocess.Popen(
                [exe, "worker", "--database-url", url, "--schema", SCHEMA, "--import",
                 "notify_delay", "--log-level", "warning", "--instance-id", f"notify-{i}",
                 "--metrics-address", "off", "--notify-config", str(config)],
                env=env, stdout=log, stderr=log))
    return procs


def wait_listening(url: str, count: int, timeout: float = 60.0) -> None:
    """Until every sender LISTENs on the notes' channel (each worker also LISTENs for jobs)."""
    from cronkeeper.db.wake import notes_channel

    deadline = time.monotonic() + timeout
    with psycopg.connect(plain(url), autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query = %s",
                           (f'LISTEN "{notes_channel(SCHEMA)}"',)).fetchone()[0] < count:
            if time.monotonic() > deadline:
                raise SystemExit("the senders did not start listening")
            time.sleep(0.05)


def run_round(url: str, receiver: Receiver, name: str, first: int, n: int, gap: float,
              timeout: float) -> list[float]:
    keys = [f"bench-{i}@2026-03-08T07:00:00Z" for i in range(first, first + n)]
    with psycopg.connect(plain(url), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{SCHEMA}"')
        for k, key in enumerate(keys):
            schedule = key.split("@")[0]
            if gap:
                conn.execute("INSERT INTO outbox (idempotency_key, schedule, task, owner, "
                             "max_attempts) VALUES (%s, %s, 'bench.dies', 'bench', 1)",
                             (key, schedule))
                conn.execute("SELECT pg_notify(left('cronkeeper.' || current_schema(), 63), '')")
                time.sleep(gap)
            elif k == 0:
                with conn.transaction():
                    conn.cursor().executemany(
                        "INSERT INTO outbox (idempotency_key, schedule, task, owner, "
                        "max_attempts) VALUES (%s, %s, 'bench.dies', 'bench', 1)",
                        [(x, x.split("@")[0]) for x in keys])
                    conn.execute("SELECT pg_notify(left('cronkeeper.' || current_schema(), 63), "
                                 "'')")
        deadline = time.monotonic() + timeout
        while sum(1 for key in keys if key in receiver.arrived) < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: only {sum(k in receiver.arrived for k in keys)} of "
                                 f"{n} notifications arrived")
            time.sleep(0.05)
        dead_at = dict(conn.execute(
            "SELECT idempotency_key, extract(epoch FROM finished_at)::float8 FROM outbox "
            "WHERE idempotency_key = ANY(%s) AND state = 'dead'", (keys,)).fetchall())
    return [receiver.arrived[key] - dead_at[key] for key in keys]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=os.environ.get(
        "CRONKEEPER_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--dead", type=int, default=300, help="dead letters per round")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between spaced jobs")
    parser.add_argument("--senders", type=int, default=1, help="worker processes (senders)")
    args = parser.parse_args()
    fresh_schema(args.database_url)
    receiver = Receiver()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "notify.toml"
        config.write_text(f'[sinks.hook]\nkind = "webhook"\nurl = "{receiver.url}"\n'
                          '[[rules]]\nsink = "hook"\n')
        workers = start_workers(args.database_url, args.senders, config)
        try:
            wait_listening(args.database_url, args.senders)
            print(f"{args.dead} dead letters of distinct schedules per round, {args.senders} "
                  f"worker(s) with a sender, webhook on loopback; load {os.getloadavg()[0]:.2f}")
            rounds = [("spaced", 0, args.gap), ("burst", args.dead, 0.0)]
            for name, first, gap in rounds:
                delays = run_round(args.database_url, receiver, name, first, args.dead, gap,
                                   timeout=120 + args.dead * (gap + 0.05))
                ms = [d * 1000 for d in delays]
                print(f"{name:>7}: p50 {percentile(ms, 0.5):8.1f} ms  p99 "
                      f"{percentile(ms, 0.99):8.1f} ms  max {max(ms):8.1f} ms  mean "
                      f"{statistics.fmean(ms):8.1f} ms  (gap {gap * 1000:.0f} ms; load "
                      f"{os.getloadavg()[0]:.2f})")
            print(f"requests received: {receiver.count} for {2 * args.dead} notifications")
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(30)


if __name__ == "__main__":
    main()
