"""Worker throughput: N no-op jobs drained by W worker processes, for cronkeeper, procrastinate
and pgqueuer on the same database in the same run, plus a bare-SQL floor (claim and complete
100 jobs per statement, from W processes).

    .venv/bin/python benchmarks/worker_throughput.py --jobs 100000 --workers 2 \\
        --database-url postgresql://postgres@127.0.0.1:5432/test

Each system gets a fresh schema of its own (search_path), its jobs are inserted before the clock
starts, and the clock runs from starting the worker processes until no job is left (so process
start-up is included for everyone). Prints jobs/s and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent

# The cronkeeper handler: imported by `cronkeeper worker --import worker_throughput`.
try:
    from cronkeeper.worker import task as _task

    @_task("bench.noop")
    def bench_noop(payload, ctx):  # noqa: ANN001, ARG001
        return None
except ImportError:  # pragma: no cover
    pass


def conninfo(url: str, schema: str | None = None) -> str:
    url = url.replace("postgresql+psycopg://", "postgresql://")
    if schema:
        sep = "&" if "?" in url else "?"
        url += f"{sep}options=-csearch_path%3D{schema}"
    return url


def fresh_schema(url: str, schema: str) -> None:
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')


def count(url: str, schema: str, sql: str) -> int:
    with psycopg.connect(conninfo(url, schema), autocommit=True) as conn:
        return conn.execute(sql).fetchone()[0]


def drain(procs: list[subprocess.Popen], url: str, schema: str, remaining_sql: str,
          timeout: float) -> float:
    start = time.monotonic()
    try:
        while count(url, schema, remaining_sql) > 0:
            if time.monotonic() - start > timeout:
                raise SystemExit(f"{schema}: not drained after {timeout}s")
            if any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit(f"{schema}: a worker died: {[p.returncode for p in procs]}")
            time.sleep(0.05)
        return time.monotonic() - start
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


# -- cronkeeper ----------------------------------------------------------------------------

def bench_cronkeeper(url: str, jobs: int, workers: int, args: argparse.Namespace) -> float:
    schema = "bench_cronkeeper"
    fresh_schema(url, schema)
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.migrate import migrate

    engine = make_engine(normalize_url(url), "public", pool_size=1)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    migrate(engine, schema)
    engine.dispose()
    with psycopg.connect(conninfo(url, schema), autocommit=True) as conn:
        conn.execute("INSERT INTO outbox (idempotency_key, task) "
                     "SELECT 'bench-' || i, 'bench.noop' FROM generate_series(1, %s) i", (jobs,))
        conn.execute("VACUUM ANALYZE outbox")
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    procs = [subprocess.Popen(
        [exe, "worker", "--database-url", url, "--schema", schema, "--import", "worker_throughput",
         "--concurrency", str(args.concurrency), "--batch-size", str(args.batch_size),
         "--poll-interval", "0.05", "--log-level", "warning", "--instance-id", f"bench-{i}"],
        env=env) for i in range(workers)]
    return drain(procs, url, schema, "SELECT count(*) FROM outbox WHERE state <> 'succeeded'", 900)


# -- bare SQL floor ---------------------------------------------------------------------------

FLOOR_CLAIM = """
UPDATE floor_jobs SET state = 'running' WHERE id IN (
    SELECT id FROM floor_jobs WHERE state = 'available' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
FLOOR_DONE = "UPDATE floor_jobs SET state = 'succeeded' WHERE id = ANY(%s)"


def floor_worker(url: str) -> None:
    with psycopg.connect(conninfo(url, "bench_floor"), autocommit=True) as conn:
        while True:
            ids = [r[0] for r in conn.execute(FLOOR_CLAIM).fetchall()]
            if not ids:
                return
            conn.execute(FLOOR_DONE, (ids,), binary=True)


def bench_floor(url: str, jobs: int, workers: int) -> float:
    fresh_schema(url, "bench_floor")
    with psycopg.connect(conninfo(url, "bench_floor"), autocommit=True) as conn:
        conn.execute("CREATE TABLE floor_jobs (id bigserial PRIMARY KEY, state text NOT NULL, "
                     "payload jsonb NOT NULL DEFAULT '{}')")
        conn.execute("CREATE INDEX ON floor_jobs (id) WHERE state = 'available'")
        conn.execute("INSERT INTO floor_jobs (state) SELECT 'available' FROM generate_series(1, %s)", (jobs,))
        conn.execute("VACUUM ANALYZE floor_jobs")
    procs = [subprocess.Popen([sys.executable, __file__, "--role", "floor", "--database-url", url])
             for _ in range(workers)]
    return drain(procs, url, "bench_floor", "SELECT count(*) FROM floor_jobs WHERE state <> 'succeeded'", 900)


# -- procrastinate ------------------------------------------------------------------------------

def procrastinate_app(url: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=conninfo(url, "bench_procrastinate")))

    @app.task(name="noop")
    def noop() -> None:
        return None

    return app, noop


def procrastinate_worker(url: str, concurrency: int) -> None:
    app, _ = procrastinate_app(url)
    with app.open():
        app.run_worker(concurrency=concurrency, wait=False, listen_notify=False,
                       fetch_job_polling_interval=0.05, install_signal_handlers=False,
                       delete_jobs="never")


def bench_procrastinate(url: str, jobs: int, workers: int, concurrency: int) -> float:
    fresh_schema(url, "bench_procrastinate")
    app, noop = procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()
        for start in range(0, jobs, 5000):
            noop.batch_defer(*({} for _ in range(min(5000, jobs - start))))
    procs = [subprocess.Popen([sys.executable, __file__, "--role", "procrastinate", "--database-url",
                               url, "--concurrency", str(concurrency)]) for _ in range(workers)]
    return drain(procs, url, "bench_procrastinate",
                 "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'", 900)


# -- pgqueuer -----------------------------------------------------------------------------------

async def pgqueuer_worker(url: str, batch_size: int, concurrency: int) -> None:
    from datetime import timedelta

    from pgqueuer import PsycopgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    conn = await psycopg.AsyncConnection.connect(conninfo(url, "bench_pgqueuer"), autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint("noop", concurrency_limit=concurrency)
    async def noop(job) -> None:  # noqa: ANN001, ARG001
        return None

    await qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain,
                 dequeue_timeout=timedelta(seconds=0.05))


async def pgqueuer_setup(url: str, jobs: int) -> None:
    from pgqueuer import PsycopgDriver, Queries

    conn = await psycopg.AsyncConnection.connect(conninfo(url, "bench_pgqueuer"), autocommit=True)
    queries = Queries(PsycopgDriver(conn))
    await queries.install()
    for start in range(0, jobs, 5000):
        n = min(5000, jobs - start)
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    await conn.close()


def bench_pgqueuer(url: str, jobs: int, workers: int, args: argparse.Namespace) -> float:
    fresh_schema(url, "bench_pgqueuer")
    asyncio.run(pgqueuer_setup(url, jobs))
    procs = [subprocess.Popen([sys.executable, __file__, "--role", "pgqueuer", "--database-url", url,
                               "--batch-size", str(args.batch_size), "--concurrency",
                               str(args.concurrency)]) for _ in range(workers)]
    return drain(procs, url, "bench_pgqueuer", "SELECT count(*) FROM pgqueuer", 900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--only", default="floor,cronkeeper,procrastinate,pgqueuer")
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = args.database_url
    if args.role == "floor":
        return floor_worker(url)
    if args.role == "procrastinate":
        return procrastinate_worker(url, args.concurrency)
    if args.role == "pgqueuer":
        return asyncio.run(pgqueuer_worker(url, args.batch_size, args.concurrency))
    runners = {
        "floor": lambda: bench_floor(url, args.jobs, args.workers),
        "cronkeeper": lambda: bench_cronkeeper(url, args.jobs, args.workers, args),
        "procrastinate": lambda: bench_procrastinate(url, args.jobs, args.workers, min(args.concurrency, 50)),
        "pgqueuer": lambda: bench_pgqueuer(url, args.jobs, args.workers, args),
    }
    rates: dict[str, float] = {}
    for name in args.only.split(","):
        seconds = runners[name]()
        rates[name] = args.jobs / seconds
        print(f"{name:14s} {args.jobs} jobs in {seconds:7.2f} s = {rates[name]:9.0f} jobs/s", flush=True)
    if "cronkeeper" in rates:
        for name, rate in rates.items():
            if name != "cronkeeper":
                print(f"cronkeeper / {name:14s} = {rates['cronkeeper'] / rate:5.2f}")


if __name__ == "__main__":
    main()
