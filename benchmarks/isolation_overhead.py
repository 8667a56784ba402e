"""What process isolation costs: the same jobs drained by `cronkeeper worker --isolation thread`
and `--isolation process` in one run, on the same database, same worker count and options.

    .venv/bin/python benchmarks/isolation_overhead.py --jobs 20000 --workers 2 \\
        --database-url postgresql://postgres@127.0.0.1:5432/test

Rows, each for both isolation modes at the worker's defaults (--concurrency 10, --batch-size
100):
- ``noop``: a handler that does nothing (the recorder completes jobs in batches);
- ``effect``: a handler that claims an effect in the job's transaction, so each job commits
  its own transaction with the fenced completion (in the runner thread, or in the child);
- ``async-noop``: an ``async def`` handler that does nothing;
- ``serial noop``: one worker, ``--concurrency 1``: jobs one after the other, so the
  difference per job between the modes is what process isolation adds to a job's latency;
- ``round trip``: the hand-over alone, without a worker or the database: a job frame to one
  pooled child running the no-op handler, and its answer back, ``--round-trips`` times;
- ``rq``: the peer whose model process isolation follows, RQ (``pip install rq``; Redis at
  ``--redis-url``, a queue of this run's own, never flushed): its default ``Worker`` forks a
  work horse per job and kills it at the job's timeout. Its best settings for that model,
  from its docs ("Performance notes": preload what jobs import before the fork; one job per
  worker process, so start more workers for concurrency; ``--burst`` drains and exits): a
  job function in a module that imports nothing (``rq_noop.py``), ``result_ttl=0``, and
  ``--rq-workers`` (default 20: our 2 workers x 10 jobs at once) burst workers.

Each row gets a fresh schema (``bench_iso``), its jobs inserted before the clock starts; the
clock runs from starting the workers (process start-up, children's included) until no job is
left. Prints jobs/s, process/thread ratios and the per-job difference of the serial row.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
SCHEMA = "bench_iso"
POLL = 0.05

try:  # the handlers: imported by `cronkeeper worker --import isolation_overhead`
    from cronkeeper.worker import task as _task

    @_task("bench.noop")
    def bench_noop(payload, ctx):  # noqa: ANN001, ARG001
        return None

    @_task("bench.effect")
    def bench_effect(payload, ctx):  # noqa: ANN001
        with ctx.effect(f"bench:{ctx.key}") as first:
            assert first

    @_task("bench.async_noop")
    async def bench_async_noop(payload, ctx):  # noqa: ANN001, ARG001
        return None
except ImportError:  # pragma: no cover
    pass

PENDING = ("SELECT EXISTS (SELECT 1 FROM outbox WHERE state = 'available')"
           " OR EXISTS (SELECT 1 FROM outbox WHERE state = 'running')")


def libpq(url: str, schema: str | None = None) -> str:
    url = url.replace("postgresql+psycopg://", "postgresql://")
    if schema:
        url += ("&" if "?" in url else "?") + f"options=-csearch_path%3D{schema}"
    return url


def prepare(url: str, task: str, jobs: int) -> None:
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.migrate import migrate

    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    engine = make_engine(normalize_url(url), "public", pool_size=1)
    migrate(engine, SCHEMA)
    engine.dispose()
    with psycopg.connect(libpq(url, SCHEMA), autocommit=True) as conn:
        conn.execute("INSERT INTO outbox (idempotency_key, task) "
                     "SELECT 'bench-' || i, %s FROM generate_series(1, %s) i", (task, jobs))
        conn.execute("VACUUM ANALYZE outbox")


def drain(url: str, task: str, jobs: int, workers: int, extra: list[str]) -> float:
    prepare(url, task, jobs)
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    start = time.monotonic()
    procs = [subprocess.Popen(
        [exe, "worker", "--database-url", url, "--schema", SCHEMA, "--import",
         "isolation_overhead", "--poll-interval", "0.05", "--log-level", "warning",
         "--metrics-address", "off", "--instance-id", f"bench-{i}", *extra], env=env)
        for i in range(workers)]
    try:
        with psycopg.connect(libpq(url, SCHEMA), autocommit=True) as conn:
            while conn.execute(PENDING).fetchone()[0]:
                if any(p.poll() is not None for p in procs):
                    raise SystemExit(f"a worker died: {[p.poll() for p in procs]}")
                time.sleep(POLL)
            seconds = time.monotonic() - start
            done = conn.execute("SELECT count(*) FROM outbox WHERE state = 'succeeded'").fetchone()[0]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    if done != jobs:
        raise SystemExit(f"{done} jobs succeeded, expected {jobs}")
    return seconds


def round_trip(url: str, count: int) -> float:
    """Seconds per job handed to one pooled child (no-op handler, no database) and back."""
    from cronkeeper import clock
    from cronkeeper.worker.pool import ChildProcess

    child = ChildProcess({"t": "init", "database_url": url, "schema": SCHEMA, "worker_id": "rt",
                          "imports": ["isolation_overhead"], "sys_path": [str(HERE), *sys.path]})
    try:
        if child.wait_ready() is not None:
            raise SystemExit("the child did not start")
        job = {"t": "job", "id": 1, "key": "k", "attempt": 1, "schedule": None,
               "task": "bench.noop", "payload_json": "{}", "scheduled_for": None}
        start = time.monotonic()
        for _ in range(count):
            child.send(job)
            answer = child.read(clock.monotonic() + 30)
            if not isinstance(answer, dict) or answer.get("done") != "succeeded":
                raise SystemExit(f"unexpected answer {answer!r}")
        return (time.monotonic() - start) / count
    finally:
        child.retire(1.0)


def rq_drain(redis_url: str, jobs: int, workers: int) -> float:
    """Seconds for ``workers`` RQ burst workers (fork per job) to run ``jobs`` no-op jobs."""
    from redis import Redis
    from rq import Queue
    from rq.registry import FailedJobRegistry

    redis = Redis.from_url(redis_url)
    name = f"ck-bench-{os.getpid()}"
    queue = Queue(name, connection=redis)
    with redis.pipeline() as pipe:
        queue.enqueue_many([Queue.prepare_data("rq_noop.noop", result_ttl=0)
                            for _ in range(jobs)], pipeline=pipe)
        pipe.execute()
    exe = str(Path(sys.executable).with_name("rq"))
    start = time.monotonic()
    procs = [subprocess.Popen([exe, "worker", "--burst", "--url", redis_url, "--path", str(HERE),
                               "--quiet", name]) for _ in range(workers)]
    codes = [p.wait() for p in procs]
    seconds = time.monotonic() - start
    failed = FailedJobRegistry(name, connection=redis).count
    left = queue.count
    queue.delete(delete_jobs=True)
    for key in redis.scan_iter(match=f"rq:*{name}*"):  # this run's keys only
        redis.delete(key)
    if any(codes) or failed or left:
        raise SystemExit(f"rq: exit codes {codes}, {failed} failed, {left} left")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--serial-jobs", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--round-trips", type=int, default=5_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--rq-jobs", type=int, default=5_000)
    parser.add_argument("--rq-workers", type=int, default=20)
    parser.add_argument("--only", default="", help="comma-separated row labels (default: all)")
    args = parser.parse_args()
    url = args.database_url
    rows = [("noop", "bench.noop", args.jobs, args.workers, []),
            ("effect", "bench.effect", args.jobs, args.workers, []),
            ("async-noop", "bench.async_noop", args.jobs, args.workers, []),
            ("serial noop", "bench.noop", args.serial_jobs, 1, ["--concurrency", "1"])]
    if args.only:
        wanted = {w.strip() for w in args.only.split(",")}
        rows = [r for r in rows if r[0] in wanted]
    serial: dict[str, float] = {}
    noop_process = 0.0
    try:
        for label, task, jobs, workers, extra in rows:
            rates = {}
            for mode in ("thread", "process"):
                seconds = drain(url, task, jobs, workers, ["--isolation", mode, *extra])
                rates[mode] = jobs / seconds
                if label == "serial noop":
                    serial[mode] = seconds / jobs
                if (label, mode) == ("noop", "process"):
                    noop_process = rates[mode]
                print(f"{label:12s} {mode:8s} {jobs:6d} jobs, {workers} worker(s): {seconds:7.2f} s"
                      f" = {rates[mode]:8.0f} jobs/s", flush=True)
            print(f"{label:12s} process / thread = {rates['process'] / rates['thread']:5.2f}",
                  flush=True)
    finally:
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    if not args.only or "round trip" in args.only:
        per_job = round_trip(url, args.round_trips)
        print(f"round trip   process  {args.round_trips} jobs to one child and back: "
              f"{per_job * 1e6:.0f} us per job", flush=True)
    if not args.only or "rq" in args.only:
        seconds = rq_drain(args.redis_url, args.rq_jobs, args.rq_workers)
        rate = args.rq_jobs / seconds
        print(f"rq (fork per job) {args.rq_jobs} no-op jobs, {args.rq_workers} workers: "
              f"{seconds:7.2f} s = {rate:8.0f} jobs/s", flush=True)
        if noop_process:
            print(f"cronkeeper process noop / rq = {noop_process / rate:5.2f}", flush=True)
    if serial:
        extra_us = (serial["process"] - serial["thread"]) * 1e6
        print(f"per job, one at a time: thread {serial['thread'] * 1e6:.0f} us, process "
              f"{serial['process'] * 1e6:.0f} us (handing a job to a child and back: "
              f"{extra_us:+.0f} us)")


if __name__ == "__main__":
    main()
