"""A burst: 10,000 schedules due in the same second, through cronkeeper and through APScheduler 3.

Both run against the same private PostgreSQL (tests/daemon_harness.py; fsync on by default,
``track_commit_timestamp = on`` so each row's commit instant can be read back).

cronkeeper: 10,000 schedules ``every = "30s"`` (anchored to the epoch, so all fall due at the
same instants) in 100 generated files, one `cronkeeper run` process (the leader). The first
instant after the schedules are adopted is measured. Fire lag of a period = the commit time of
the transaction that wrote its outbox row (``pg_xact_commit_timestamp(xmin)``) minus
``scheduled_for``: when a worker could first see the job. ``created_at`` (the emitting
transaction's start, ``now()``) minus ``scheduled_for`` is printed as well.

APScheduler 3.11: a BackgroundScheduler with an SQLAlchemyJobStore on the same database (psycopg
3 driver), ``misfire_grace_time=None``, and its ThreadPoolExecutor (``--aps-threads``, default
10 as in APScheduler's own default executor); 10,000 jobs with a DateTrigger at one instant,
each inserting one row into a table. Lag = that row's commit time minus the trigger instant.

    .venv/bin/pip install -e '.[bench]'   # APScheduler is in the bench extra only
    .venv/bin/python benchmarks/burst_vs_apscheduler.py [--schedules 10000] [--aps-threads 10]
        [--fsync on|off] [--skip-apscheduler]

Prints p50/p99/max for both, that every job committed, and the ratio.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from daemon_harness import (  # noqa: E402 - the harness lives with the tests
    Daemon,
    PrivatePostgres,
    db_now,
    set_path,
    wait_for,
)

EVERY = 30  # seconds

LAG_SQL = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.99) WITHIN GROUP
       (ORDER BY lag), max(lag), min(lag), count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY start_lag),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY start_lag), max(start_lag)
FROM (SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin) - {due})::float8 AS lag,
             extract(epoch FROM {start} - {due})::float8 AS start_lag
      FROM {table} WHERE {where}) l
"""


def write_files(directory: Path, n: int, per_file: int = 100) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for f in range(math.ceil(n / per_file)):
        parts = []
        for i in range(f * per_file, min(n, (f + 1) * per_file)):
            parts.append(
                f'[burst-{i:05d}]\nevery = "{EVERY}s"\ntimezone = "UTC"\nmisfire = "skip"\n'
                f'overlap = "allow"\ntask = "bench.burst"\nowner = "bench"\n')
        (directory / f"burst-{f:03d}.toml").write_text("\n".join(parts))


def print_lags(label: str, row: tuple, start_label: str) -> float:
    p50, p99, worst, best, count, s50, s99, smax = row
    print(f"{label}: {count} rows; commit lag p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {worst * 1000:.0f} ms (min {best * 1000:.0f} ms); {start_label} lag "
          f"p50 {s50 * 1000:.0f} ms, p99 {s99 * 1000:.0f} ms, max {smax * 1000:.0f} ms", flush=True)
    return p99


def bench_cronkeeper(pg: PrivatePostgres, n: int, root: Path) -> tuple:
    schema = pg.new_schema()
    files = root / "schedules"
    write_files(files, n)
    daemon = Daemon(url=pg.url, schema=schema, cluster="bench", schedules=files,
                    instance_id="bench-leader", log_dir=root, leader_timeout=10,
                    stall_timeout=60)
    db = set_path(pg.connect(), schema)
    started = time.monotonic()
    daemon.start()
    try:
        wait_for(lambda: db.execute("SELECT count(*) FROM schedule_versions").fetchone()[0] >= n,
                 120, f"{n} schedules adopted", interval=0.2)
        active_from = db.execute("SELECT max(active_from) FROM schedule_versions").fetchone()[0]
        print(f"cronkeeper: {n} schedules loaded and adopted in "
              f"{time.monotonic() - started:.1f} s", flush=True)
        epoch = active_from.timestamp()
        due = datetime.fromtimestamp((math.floor(epoch / EVERY) + 1) * EVERY, active_from.tzinfo)
        print(f"cronkeeper: burst at {due.isoformat()} "
              f"({(due - db_now(db)).total_seconds():.1f} s from now)", flush=True)
        wait_for(lambda: db.execute("SELECT count(*) FROM periods WHERE scheduled_for = %s",
                                    (due,)).fetchone()[0] >= n,
                 EVERY + 120, "the whole burst decided", interval=0.2)
        row = db.execute(LAG_SQL.format(due="scheduled_for", start="created_at", table="outbox",
                                        where="scheduled_for = %s"), (due,)).fetchone()
        jobs = db.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM outbox "
                          "WHERE scheduled_for = %s", (due,)).fetchone()
        txs = db.execute("SELECT count(DISTINCT xmin::text) FROM outbox WHERE scheduled_for = %s",
                         (due,)).fetchone()[0]
        print(f"cronkeeper: {jobs[0]} jobs committed ({jobs[1]} distinct keys) "
              f"in {txs} transaction(s)", flush=True)
        return row
    finally:
        daemon.stop(30)
        db.close()


# -- APScheduler ------------------------------------------------------------------------------------
_local = threading.local()
_APS_URL = ""


def record(job: int, scheduled_for: datetime) -> None:
    """The APScheduler job: insert one row (its commit time is the fire time measured)."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = psycopg.connect(_APS_URL, autocommit=True)
    conn.execute("INSERT INTO aps_bench.runs (job, scheduled_for) VALUES (%s, %s)",
                 (job, scheduled_for))


def bench_apscheduler(pg: PrivatePostgres, n: int, threads: int) -> tuple:
    from apscheduler.executors.pool import ThreadPoolExecutor  # noqa: PLC0415
    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore  # noqa: PLC0415
    from apscheduler.schedulers.background import BackgroundScheduler  # noqa: PLC0415
    from apscheduler.triggers.date import DateTrigger  # noqa: PLC0415

    global _APS_URL
    _APS_URL = pg.url
    with pg.connect() as admin:
        admin.execute("DROP SCHEMA IF EXISTS aps_bench CASCADE")
        admin.execute("CREATE SCHEMA aps_bench")
        admin.execute("CREATE TABLE aps_bench.runs (job integer PRIMARY KEY, "
                      "scheduled_for timestamptz NOT NULL, "
                      "inserted_at timestamptz NOT NULL DEFAULT clock_timestamp())")
    scheduler = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(
            url=pg.url.replace("postgresql://", "postgresql+psycopg://"),
            tableschema="aps_bench")},
        executors={"default": ThreadPoolExecutor(threads)},
        job_defaults={"misfire_grace_time": None, "coalesce": False, "max_instances": 1},
        timezone="UTC",
    )
    scheduler.start(paused=True)
    db = pg.connect()
    try:
        # 10,000 inserts into the job store take a while: put the instant far enough ahead
        probe_start = time.monotonic()
        now = db_now(db)
        due = datetime.fromtimestamp(math.ceil(now.timestamp() + 10 + n * 0.003), now.tzinfo)
        for i in range(n):
            scheduler.add_job(record, DateTrigger(run_date=due), args=[i, due], id=f"burst-{i}",
                              misfire_grace_time=None)
        added = time.monotonic() - probe_start
        left = (due - db_now(db)).total_seconds()
        print(f"APScheduler: {n} jobs added to its SQLAlchemyJobStore in {added:.1f} s; "
              f"burst at {due.isoformat()} ({left:.1f} s from now)", flush=True)
        if left < 1:
            raise SystemExit("adding the jobs took past the burst instant: rerun on a faster machine")
        scheduler.resume()
        wait_for(lambda: db.execute("SELECT count(*) FROM aps_bench.runs").fetchone()[0] >= n,
                 left + 600, "every APScheduler job to run", interval=0.2)
        row = db.execute(LAG_SQL.format(due="scheduled_for", start="inserted_at",
                                        table="aps_bench.runs", where="true")).fetchone()
        jobs = db.execute("SELECT count(*), count(DISTINCT job) FROM aps_bench.runs").fetchone()
        print(f"APScheduler: {jobs[0]} rows committed ({jobs[1]} distinct jobs)", flush=True)
        return row
    finally:
        scheduler.shutdown(wait=True)
        db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--aps-threads", type=int, default=10)
    parser.add_argument("--fsync", choices=["on", "off"], default="on")
    parser.add_argument("--skip-apscheduler", action="store_true")
    args = parser.parse_args()
    logging.getLogger("apscheduler").setLevel(logging.ERROR)

    pg = PrivatePostgres(fsync=args.fsync == "on",
                         settings={"track_commit_timestamp": "on"}).start()
    root = Path(tempfile.mkdtemp(prefix="cronkeeper-burst-"))
    try:
        ck = bench_cronkeeper(pg, args.schedules, root)
        ck_p99 = print_lags("cronkeeper", ck, "transaction start (created_at)")
        if args.skip_apscheduler:
            return
        aps = bench_apscheduler(pg, args.schedules, args.aps_threads)
        aps_p99 = print_lags(f"APScheduler ({args.aps_threads} threads)", aps, "insert (clock_timestamp)")
        print(f"\nfsync={args.fsync}, {args.schedules} schedules due at one instant")
        print(f"{'':14}{'p50':>10}{'p99':>10}{'max':>10}")
        for label, row in (("cronkeeper", ck), ("APScheduler", aps)):
            print(f"{label:14}" + "".join(f"{v * 1000:8.0f}ms" for v in row[:3]))
        print(f"ratio (APScheduler / cronkeeper): p50 {aps[0] / ck[0]:.1f}x, "
              f"p99 {aps_p99 / ck_p99:.1f}x, max {aps[2] / ck[2]:.1f}x")
    finally:
        pg.stop()


if __name__ == "__main__":
    main()

