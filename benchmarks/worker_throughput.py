"""Worker throughput: N no-op jobs drained by W worker processes, for cronkeeper (at its defaults
and tuned), pgqueuer at its best, procrastinate and a bare-SQL floor (claim and complete 100
jobs per statement, from W processes), on the same database in the same run; then bulk enqueue:
20,000 jobs with ``cronkeeper.enqueue_many`` against pgqueuer's list-form ``enqueue``.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python benchmarks/worker_throughput.py --jobs 100000 --workers 2 \
        --database-url postgresql://postgres@127.0.0.1:5432/test [--only floor,cronkeeper]

Each system gets a fresh schema of its own (search_path, ``bench_<name>``), dropped afterwards
(``--keep`` keeps it); its jobs are inserted before the clock starts, and the clock runs from
starting the worker processes until no job is left (process start-up is included for everyone).
"No job left" is checked every 50 ms on one connection with an EXISTS over an index, so the
check costs the database next to nothing. Prints jobs/s and the ratios of cronkeeper to each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
POLL = 0.05  # seconds between checks that the queue is drained

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


CPU: dict[str, tuple[float, float]] = {}  # schema -> CPU seconds of (workers, their backends)


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process on this machine; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError):
        return 0.0


def client_ports(pid: int) -> set[int]:
    """Local TCP ports of a process's sockets, from /proc (its fds' socket inodes, matched in
    /proc/PID/net/tcp and tcp6): the client ports of its database connections."""
    inodes = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except OSError:
        return set()
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


class CpuMeter:
    """CPU seconds spent by the worker processes and by the PostgreSQL backends they connect to
    (found by client port, read from /proc: the server must run on this machine and its
    processes' /proc/PID/stat be readable, as they are for root or the postgres user), sampled
    while they run (a process's counters vanish when it exits, so the last sample counts)."""

    def __init__(self, procs: list[subprocess.Popen]) -> None:
        self.procs = procs
        self.last: dict[int, float] = {}
        self.backends: set[int] = set()

    def sample(self, conn: psycopg.Connection) -> None:
        ports: set[int] = set()
        for p in self.procs:
            ports |= client_ports(p.pid)
        if ports:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)"
                                " AND client_addr IS NOT NULL", (list(ports),)).fetchall()
            self.backends.update(pid for (pid,) in rows)
        for pid in [p.pid for p in self.procs] + list(self.backends):
            value = proc_cpu(pid)
            if value:
                self.last[pid] = value

    def totals(self) -> tuple[float, float]:
        workers = sum(self.last.get(p.pid, 0.0) for p in self.procs)
        return workers, sum(self.last.get(pid, 0.0) for pid in self.backends)


def drain(procs: list[subprocess.Popen], url: str, schema: str, pending_sql: str,
          timeout: float) -> float:
    """Seconds from now until ``pending_sql`` (a cheap EXISTS over an index, on one connection)
    says no job is left, or every worker exited on its own after draining the queue."""
    start = time.monotonic()
    meter = CpuMeter(procs)
    try:
        with psycopg.connect(conninfo(url, schema), autocommit=True) as conn:
            while True:
                exited = [p.poll() for p in procs]
                if any(code not in (None, 0) for code in exited):
                    raise SystemExit(f"{schema}: a worker died: {exited}")
                if not conn.execute(pending_sql).fetchone()[0]:
                    return time.monotonic() - start
                if all(code == 0 for code in exited):
                    raise SystemExit(f"{schema}: workers exited with jobs left")
                if time.monotonic() - start > timeout:
                    raise SystemExit(f"{schema}: not drained after {timeout}s")
                meter.sample(conn)
                time.sleep(POLL)
    finally:
        CPU[schema] = meter.totals()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def check_done(url: str, schema: str, sql: str, expected: int) -> None:
    with psycopg.connect(conninfo(url, schema), autocommit=True) as conn:
        done = conn.execute(sql).fetchone()[0]
    if done != expected:
        raise SystemExit(f"{schema}: {done} jobs done, expected {expected}")


def drop_schema(url: str, schema: str) -> None:
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- cronkeeper ----------------------------------------------------------------------------

CK_PENDING = ("SELECT EXISTS (SELECT 1 FROM outbox WHERE state = 'available')"
              " OR EXISTS (SELECT 1 FROM outbox WHERE state = 'running')")


def bench_cronkeeper(url: str, jobs: int, args: argparse.Namespace, *, tuned: bool = False) -> float:
    """``cronkeeper worker`` at its defaults (what a new user runs), or tuned (--concurrency and
    --batch-size from the command line)."""
    schema = "bench_cronkeeper_tuned" if tuned else "bench_cronkeeper"
    drop_schema(url, schema)
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.migrate import migrate

    engine = make_engine(normalize_url(url), "public", pool_size=1)
    migrate(engine, schema)
    engine.dispose()
    with psycopg.connect(conninfo(url, schema), autocommit=True) as conn:
        conn.execute("INSERT INTO outbox (idempotency_key, task) "
                     "SELECT 'bench-' || i, 'bench.noop' FROM generate_series(1, %s) i", (jobs,))
        conn.execute("VACUUM ANALYZE outbox")
        conn.execute("VACUUM ANALYZE attempts")
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    knobs = ["--concurrency", str(args.concurrency), "--batch-size", str(args.batch_size)] if tuned else []
    procs = [subprocess.Popen(
        [exe, "worker", "--database-url", url, "--schema", schema, "--import", "worker_throughput",
         *knobs, "--log-level", "warning", "--instance-id", f"bench-{i}",
         "--metrics-address", "off"],
        env=env) for i in range(args.workers)]
    seconds = drain(procs, url, schema, CK_PENDING, 900)
    check_done(url, schema, "SELECT count(*) FROM outbox WHERE state = 'succeeded'", jobs)
    return seconds


def bench_cronkeeper_tuned(url: str, jobs: int, args: argparse.Namespace) -> float:
    return bench_cronkeeper(url, jobs, args, tuned=True)


# -- bare SQL floor ---------------------------------------------------------------------------

FLOOR_CLAIM = """
UPDATE floor_jobs SET state = 'running' WHERE id IN (
    SELECT id FROM floor_jobs WHERE state = 'available' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
FLOOR_DONE = "UPDATE floor_jobs SET state = 'succeeded' WHERE id = ANY(%s)"
FLOOR_PENDING = ("SELECT EXISTS (SELECT 1 FROM floor_jobs WHERE state = 'available')"
                 " OR EXISTS (SELECT 1 FROM floor_jobs WHERE state = 'running')")


def floor_worker(url: str) -> None:
    """Claim 100 jobs per statement, complete them in one statement; exit when none is left."""
    with psycopg.connect(conninfo(url, "bench_floor"), autocommit=True) as conn:
        while True:
            ids = [r[0] for r in conn.execute(FLOOR_CLAIM).fetchall()]
            if not ids:
                return
            conn.execute(FLOOR_DONE, (ids,), binary=True)


def bench_floor(url: str, jobs: int, args: argparse.Namespace) -> float:
    schema = "bench_floor"
    fresh_schema(url, schema)
    with psycopg.connect(conninfo(url, schema), autocommit=True) as conn:
        conn.execute("CREATE TABLE floor_jobs (id bigserial PRIMARY KEY, state text NOT NULL, "
                     "payload jsonb NOT NULL DEFAULT '{}')")
        conn.execute("CREATE INDEX ON floor_jobs (id) WHERE state = 'available'")
        conn.execute("CREATE INDEX ON floor_jobs (id) WHERE state = 'running'")
        conn.execute("INSERT INTO floor_jobs (state) SELECT 'available' FROM generate_series(1, %s)", (jobs,))
        conn.execute("VACUUM ANALYZE floor_jobs")
    procs = [subprocess.Popen([sys.executable, __file__, "--role", "floor", "--database-url", url])
             for _ in range(args.workers)]
    seconds = drain(procs, url, schema, FLOOR_PENDING, 900)
    check_done(url, schema, "SELECT count(*) FROM floor_jobs WHERE state = 'succeeded'", jobs)
    return seconds


# -- procrastinate ------------------------------------------------------------------------------
# procrastinate 3 fetches one job per statement (procrastinate_fetch_job) and writes each
# ending with one more; its knobs are the worker's concurrency (jobs in flight, each fetched in
# turn), LISTEN/NOTIFY (wake on defer) and the polling interval. Its best here: an async task
# (a sync one costs a thread hop), high concurrency, polling at 50 ms, jobs kept (no DELETE).

def procrastinate_app(url: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=conninfo(url, "bench_procrastinate"),
        kwargs={"options": "-csearch_path=bench_procrastinate"}))

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app, noop


def procrastinate_worker(url: str, concurrency: int) -> None:
    app, _ = procrastinate_app(url)
    with app.open():
        app.run_worker(concurrency=concurrency, wait=False, listen_notify=False,
                       fetch_job_polling_interval=0.05, install_signal_handlers=False,
                       delete_jobs="never")


def bench_procrastinate(url: str, jobs: int, args: argparse.Namespace) -> float:
    schema = "bench_procrastinate"
    fresh_schema(url, schema)
    app, noop = procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()
        for start in range(0, jobs, 5000):
            noop.batch_defer(*({} for _ in range(min(5000, jobs - start))))
    with psycopg.connect(conninfo(url, schema), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE procrastinate_jobs")
    procs = [subprocess.Popen([sys.executable, __file__, "--role", "procrastinate", "--database-url",
                               url, "--concurrency", str(args.procrastinate_concurrency)])
             for _ in range(args.workers)]
    seconds = drain(procs, url, schema, "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs "
                    "WHERE status IN ('todo', 'doing'))", 900)
    check_done(url, schema, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'", jobs)
    return seconds


# -- pgqueuer -----------------------------------------------------------------------------------
# pgqueuer at its best, with the settings of its own benchmark tool (janbjorge/pgqueuer,
# tools/benchmark.py, run by its CI for every driver and both strategies; the drain strategy is
# this benchmark's): the asyncpg driver (its docs/comparisons/benchmarks.md: about 1.7x psycopg),
# uvloop (the tool runs under ``uvloop.run``), ``QueueManager.run(batch_size=..., mode=
# QueueExecutionMode.drain)``. The tool defaults to 5 dequeue tasks of batch 10; on this 2-core
# machine one QueueManager per process with batch_size=100 is faster (26,000 jobs/s against
# fewer with 5 managers per process, measured for issue 10), so that is what runs here. No
# per-entrypoint concurrency limit (a limit is enforced in the dequeue statement and costs a
# count per batch). pgqueuer deletes a finished job and logs it in a statistics table.

def pgqueuer_connect(url: str):
    import asyncpg

    return asyncpg.connect(dsn=conninfo(url), server_settings={"search_path": "bench_pgqueuer"})


async def pgqueuer_worker(url: str, batch_size: int, consumers: int) -> None:
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode

    managers = []
    for _ in range(consumers):
        qm = QueueManager(Queries(AsyncpgDriver(await pgqueuer_connect(url))))

        @qm.entrypoint("noop")
        async def noop(job) -> None:  # noqa: ANN001, ARG001
            return None

        managers.append(qm)
    await asyncio.gather(*(qm.run(batch_size=batch_size, mode=QueueExecutionMode.drain)
                           for qm in managers))


async def pgqueuer_setup(url: str, jobs: int) -> None:
    from pgqueuer import AsyncpgDriver, Queries

    conn = await pgqueuer_connect(url)
    queries = Queries(AsyncpgDriver(conn))
    await queries.install()
    for start in range(0, jobs, 20_000):
        n = min(20_000, jobs - start)
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    await conn.execute("VACUUM ANALYZE pgqueuer")
    await conn.close()


def bench_pgqueuer(url: str, jobs: int, args: argparse.Namespace) -> float:
    import uvloop

    schema = "bench_pgqueuer"
    fresh_schema(url, schema)
    uvloop.run(pgqueuer_setup(url, jobs))
    procs = [subprocess.Popen([sys.executable, __file__, "--role", "pgqueuer", "--database-url", url,
                               "--pgqueuer-batch-size", str(args.pgqueuer_batch_size),
                               "--pgqueuer-consumers", str(args.pgqueuer_consumers)])
             for _ in range(args.workers)]
    seconds = drain(procs, url, schema, "SELECT EXISTS (SELECT 1 FROM pgqueuer)", 900)
    check_done(url, schema, "SELECT count(*) = 0 FROM pgqueuer", True)  # type: ignore[arg-type]
    return seconds


# -- bulk enqueue ---------------------------------------------------------------------------------
# 20,000 jobs in one call, into an empty queue: cronkeeper.enqueue_many (psycopg, one statement in
# the caller's transaction) against pgqueuer's list form of Queries.enqueue (asyncpg, its best
# driver); three rounds each, each call in a transaction of its own, the best round reported.
# Besides wall time, the CPU seconds of the client and of its PostgreSQL backend (read from
# /proc when the server runs on this machine): on a shared machine wall time mostly measures
# the neighbours, CPU time what each system costs.

def backend_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def bench_enqueue(url: str, jobs: int, args: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    """{system: (wall, client cpu, server cpu)} of the best round (by wall time)."""
    import uvloop

    import cronkeeper
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.migrate import migrate

    n = args.enqueue_jobs
    schema = "bench_enqueue"
    drop_schema(url, schema)
    engine = make_engine(normalize_url(url), "public", pool_size=1)
    migrate(engine, schema)
    engine.dispose()
    ours = []
    with psycopg.connect(conninfo(url)) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn.commit()
        for rnd in range(3):
            batch = [{"task": "bench.noop", "key": f"bulk-{rnd}-{i}", "payload": {"i": i}}
                     for i in range(n)]
            wall, cpu, server = time.perf_counter(), time.process_time(), backend_cpu(pid)
            ids = cronkeeper.enqueue_many(conn, batch, schema=schema)
            conn.commit()
            ours.append((time.perf_counter() - wall, time.process_time() - cpu,
                         backend_cpu(pid) - server))
            assert len(ids) == n and None not in ids
    drop_schema(url, schema)

    async def theirs() -> list[tuple[float, float, float]]:
        from pgqueuer import AsyncpgDriver, Queries

        fresh_schema(url, "bench_pgqueuer")
        conn = await pgqueuer_connect(url)
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        took = []
        for rnd in range(3):
            payloads = [f'{{"i": {i}, "r": {rnd}}}'.encode() for i in range(n)]
            wall, cpu, server = time.perf_counter(), time.process_time(), backend_cpu(pid)
            async with conn.transaction():
                ids = await queries.enqueue(["noop"] * n, payloads, [0] * n)
            took.append((time.perf_counter() - wall, time.process_time() - cpu,
                         backend_cpu(pid) - server))
            assert len(ids) == n
        await conn.close()
        drop_schema(url, "bench_pgqueuer")
        return took

    return {"cronkeeper": min(ours), "pgqueuer": min(uvloop.run(theirs()))}


RUNNERS = {
    "floor": bench_floor,
    "cronkeeper": bench_cronkeeper,
    "cronkeeper-tuned": bench_cronkeeper_tuned,
    "pgqueuer": bench_pgqueuer,
    "procrastinate": bench_procrastinate,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2, help="worker processes per system")
    parser.add_argument("--only", default=",".join([*RUNNERS, "enqueue"]),
                        help="comma-separated: " + ",".join([*RUNNERS, "enqueue"]))
    parser.add_argument("--concurrency", type=int, default=200, help="cronkeeper-tuned --concurrency")
    parser.add_argument("--batch-size", type=int, default=200, help="cronkeeper-tuned --batch-size")
    parser.add_argument("--enqueue-jobs", type=int, default=20_000, help="jobs per bulk enqueue")
    parser.add_argument("--procrastinate-concurrency", type=int, default=100)
    parser.add_argument("--pgqueuer-batch-size", type=int, default=100)
    parser.add_argument("--pgqueuer-consumers", type=int, default=1, help="queue managers per process")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark schemas")
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = args.database_url
    if args.role == "floor":
        return floor_worker(url)
    if args.role == "procrastinate":
        return procrastinate_worker(url, args.concurrency)
    if args.role == "pgqueuer":
        import uvloop

        return uvloop.run(pgqueuer_worker(url, args.pgqueuer_batch_size, args.pgqueuer_consumers))
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in RUNNERS and n != "enqueue"]
    if unknown:
        parser.error(f"--only: unknown {unknown}; choose from {','.join([*RUNNERS, 'enqueue'])}")
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}"
          f" (1, 5, 15 min); {args.workers} worker processes, {args.jobs} no-op jobs", flush=True)
    rates: dict[str, float] = {}
    for name in [n for n in names if n in RUNNERS]:
        try:
            seconds = RUNNERS[name](url, args.jobs, args)
        finally:
            if not args.keep:
                drop_schema(url, "bench_" + name.replace("-", "_"))
        rates[name] = args.jobs / seconds
        workers, server = CPU.get("bench_" + name.replace("-", "_"), (0.0, 0.0))
        print(f"{name:16s} {args.jobs} jobs in {seconds:7.2f} s = {rates[name]:9.0f} jobs/s;"
              f" CPU per job: workers {workers / args.jobs * 1e6:4.0f} us + PostgreSQL "
              f"{server / args.jobs * 1e6:4.0f} us; load {os.getloadavg()[0]:.1f}", flush=True)
    for ours in ("cronkeeper", "cronkeeper-tuned"):
        if ours in rates:
            for name, rate in rates.items():
                if not name.startswith("cronkeeper"):
                    print(f"{ours} / {name:14s} = {rates[ours] / rate:6.2f}")
    if "enqueue" in names:
        took = bench_enqueue(url, args.jobs, args)
        for name, (wall, cpu, server) in took.items():
            print(f"bulk enqueue of {args.enqueue_jobs}, {name:10s}: {wall:6.3f} s wall, CPU "
                  f"{cpu:.3f} s client + {server:.3f} s server", flush=True)
        print(f"bulk enqueue, pgqueuer / cronkeeper: wall {took['pgqueuer'][0] / took['cronkeeper'][0]:.2f}x,"
              f" CPU {sum(took['pgqueuer'][1:]) / sum(took['cronkeeper'][1:]):.2f}x", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
