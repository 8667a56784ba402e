"""Pickup latency: from an application's commit to the start of the job's attempt, with idle
workers (1, then 4 ``cronkeeper worker`` processes at their defaults).

    .venv/bin/python benchmarks/pickup_latency.py --jobs 300 \\
        --database-url postgresql://postgres@127.0.0.1:5432/test

One job at a time is enqueued with ``cronkeeper.enqueue`` in a transaction of its own, then the
script waits ``--gap`` seconds (so the workers are idle again) before the next. Latency is the
attempt row's ``started_at`` (the database clock at the start of the claim statement that took
the job) minus the wall clock just before ``commit()`` was called: conservative, since it
includes the commit itself (whose median is printed too, and the latency from the moment
``commit()`` returned: the notification leaves the server at commit, so a worker can start
before the application has heard its commit succeed). Database and script share this
machine's clock. Prints p50, p99 and max per worker count, and the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
SCHEMA = "bench_pickup"

try:  # the handler: imported by `cronkeeper worker --import pickup_latency`
    from cronkeeper.worker import task as _task

    @_task("bench.pickup")
    def bench_pickup(payload, ctx):  # noqa: ANN001, ARG001
        return None
except ImportError:  # pragma: no cover
    pass


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def fresh_schema(url: str) -> None:
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.migrate import migrate

    with psycopg.connect(plain(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    engine = make_engine(normalize_url(url), "public", pool_size=1)
    migrate(engine, SCHEMA)
    engine.dispose()


def start_workers(url: str, count: int) -> list[subprocess.Popen]:
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    return [subprocess.Popen(
        [exe, "worker", "--database-url", url, "--schema", SCHEMA, "--import", "pickup_latency",
         "--log-level", "warning", "--instance-id", f"pickup-{i}", "--metrics-address", "off"],
        env=env) for i in range(count)]


def wait_listening(url: str, count: int, timeout: float = 60.0) -> None:
    from cronkeeper.db.wake import wake_channel
    from cronkeeper.worker.wakeups import APPLICATION_NAME

    deadline = time.monotonic() + timeout
    with psycopg.connect(plain(url), autocommit=True) as conn:
        while True:
            n = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query = %s",
                (APPLICATION_NAME, f'LISTEN "{wake_channel(SCHEMA)}"')).fetchone()[0]
            if n >= count:
                return
            if time.monotonic() > deadline:
                raise SystemExit(f"only {n} of {count} workers LISTEN after {timeout}s")
            time.sleep(0.05)


def measure(url: str, workers: int, jobs: int, gap: float) -> tuple[list[float], list[float], list[float]]:
    import cronkeeper

    fresh_schema(url)
    procs = start_workers(url, workers)
    try:
        wait_listening(url, workers)
        time.sleep(1.0)  # let every worker finish its start-up claims and go idle
        committed: dict[int, float] = {}
        returned: dict[int, float] = {}
        commits: list[float] = []
        with psycopg.connect(plain(url)) as conn:
            for n in range(jobs):
                job = cronkeeper.enqueue(conn, "bench.pickup", {}, key=f"pickup-{workers}-{n}",
                                         schema=SCHEMA)
                before = time.time()
                conn.commit()
                after = time.time()
                commits.append(after - before)
                committed[job], returned[job] = before, after
                time.sleep(gap)
            deadline = time.monotonic() + 30
            while True:
                rows = conn.execute(
                    f'SELECT job_id, started_at FROM "{SCHEMA}".attempts WHERE attempt = 1').fetchall()
                conn.commit()
                if len(rows) >= jobs or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        if len(rows) < jobs:
            raise SystemExit(f"only {len(rows)} of {jobs} jobs started")
        latencies = [started.timestamp() - committed[job] for job, started in rows]
        after_return = [started.timestamp() - returned[job] for job, started in rows]
        return latencies, commits, after_return
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        with psycopg.connect(plain(url), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=300, help="jobs per worker count")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between enqueues")
    parser.add_argument("--workers", default="1,4", help="worker counts to measure")
    args = parser.parse_args()
    print(f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ} load before: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)", flush=True)
    for count in (int(w) for w in args.workers.split(",")):
        latencies, commits, after_return = measure(args.database_url, count, args.jobs, args.gap)
        ms = [x * 1000 for x in latencies]
        back = [x * 1000 for x in after_return]
        print(f"{count} idle worker(s), {args.jobs} jobs: commit -> attempt start "
              f"p50 {percentile(ms, 0.5):6.1f} ms  p99 {percentile(ms, 0.99):6.1f} ms  "
              f"max {max(ms):6.1f} ms; commit itself p50 {statistics.median(commits) * 1000:.1f} ms;"
              f" from commit() returned p50 {percentile(back, 0.5):.1f} ms p99 "
              f"{percentile(back, 0.99):.1f} ms; load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
