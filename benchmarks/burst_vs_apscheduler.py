"""A burst: N schedules due in the same second, through cronkeeper and through APScheduler 3.

Each count runs against a private PostgreSQL of its own (tests/daemon_harness.py; fsync on by
default, ``track_commit_timestamp = on`` so each row's commit instant can be read back); the
peer runs against the server of its count.

cronkeeper: N six-field schedules ``cron = "0,30 * * * * *"`` (``--form every`` writes
``every = "30s"`` instead; both fall due at the same instants) in files of ``--per-file``
schedules, ``overlap = "allow"``, ``misfire = "skip"``, one `cronkeeper run` process (the
leader). The first instant at least 10 s after every schedule is adopted is measured (one
that fell due during a slow start would measure the start). Start to ready: from
the process's start to its ``READY=1`` on ``$NOTIFY_SOCKET`` (database answered, schema current,
schedules loaded); start to leading: until the leader has recorded every schedule version. Fire lag of a period = the commit time of
the transaction that wrote its outbox row (``pg_xact_commit_timestamp(xmin)``) minus
``scheduled_for``: when a worker could first see the job. ``created_at`` (the emitting
transaction's start, ``now()``) minus ``scheduled_for`` is printed as well.

APScheduler 3.11: a BackgroundScheduler with an SQLAlchemyJobStore on the same database (psycopg
3 driver), ``misfire_grace_time=None``, and its ThreadPoolExecutor (``--aps-threads``);
10,000 jobs with a DateTrigger at one instant, each inserting one row into a table. Lag = that
row's commit time minus the trigger instant. APScheduler publishes no benchmark settings and its
own default executor has 10 threads; on the 2-CPU development machine (quiet, 15:54-15:58 UTC)
its p99 was 10.3-11.3 s with 10 threads, 7.7 s with 30, 7.4 s with 100 and 11.5 s with 300, so
the default here is 100, its best measured.

cronkeeper runs at its defaults but one, ``--metrics-address off`` (the test harness's daemon;
observing a burst of 100,000 with metrics on costs the leader about 0.4 s more CPU,
docs/operations.md). Defaults and tuned are the same run here: no option changes how a burst is
written (a tick's size is a constant; ticks of 10,000 instead of 5,000 measured no gain,
docs/performance.md, "third pass").

    .venv/bin/pip install -e '.[bench]'   # APScheduler is in the bench extra only
    .venv/bin/python benchmarks/burst_vs_apscheduler.py [10000 100000 | --schedules 10000 100000]
        [--peer-at 10000] [--per-file 1000] [--form cron6|every] [--aps-threads 100]
        [--fsync on|off] [--skip-apscheduler] [--calendar DATES]

``--calendar 50``: every schedule names one calendar of that many dates (issue 25), none of them
today, so the burst is emitted as without one: what the calendar costs each period decided.

Prints, per count: start to ready, fire lag p50/p99, all jobs visible (the last job's commit
minus the instant), the daemon's peak RSS (VmHWM), then the peer at ``--peer-at`` and the ratio.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
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
SETTLE = 10  # seconds between adoption's end and the burst measured, at least

LAG_SQL = """
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.99) WITHIN GROUP
       (ORDER BY lag), max(lag), min(lag), count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY start_lag),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY start_lag), max(start_lag)
FROM (SELECT extract(epoch FROM pg_xact_commit_timestamp(xmin) - {due})::float8 AS lag,
             extract(epoch FROM {start} - {due})::float8 AS start_lag
      FROM {table} WHERE {where}) l
"""


def write_files(directory: Path, n: int, per_file: int = 1000, form: str = "cron6",
                cron: str | None = None, task: str = "bench.burst", calendar: int = 0) -> None:
    """``n`` schedules ``burst-NNNNNN`` of ``form`` (or of the expression ``cron``, which
    benchmarks/h_spread.py gives), ``per_file`` to a file; with ``calendar``, each names a
    calendar of that many dates from the day after tomorrow on."""
    directory.mkdir(parents=True, exist_ok=True)
    named = ""
    if calendar:
        first = datetime.now().date() + timedelta(days=2)
        dates = ", ".join(f'"{first + timedelta(days=3 * d)}"' for d in range(calendar))
        (directory / "calendars.toml").write_text(f"[calendars.days-off]\ndates = [{dates}]\n")
        named = 'calendar = "days-off"\n'

    when = f'cron = "0,{EVERY} * * * * *"' if form == "cron6" else f'every = "{EVERY}s"'
    if cron is not None:
        when = f'cron = "{cron}"'
    for f in range(math.ceil(n / per_file)):
        parts = []
        for i in range(f * per_file, min(n, (f + 1) * per_file)):
            parts.append(
                f'[burst-{i:06d}]\n{when}\ntimezone = "UTC"\nmisfire = "skip"\n'
                f'overlap = "allow"\ntask = "{task}"\nowner = "bench"\n{named}')
        (directory / f"burst-{f:03d}.toml").write_text("\n".join(parts))


def print_lags(label: str, row: tuple, start_label: str) -> float:
    p50, p99, worst, best, count, s50, s99, smax = row
    print(f"{label}: {count} rows; commit lag p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
          f"max {worst * 1000:.0f} ms (min {best * 1000:.0f} ms); {start_label} lag "
          f"p50 {s50 * 1000:.0f} ms, p99 {s99 * 1000:.0f} ms, max {smax * 1000:.0f} ms", flush=True)
    return p99


@dataclass
class Result:
    schedules: int
    ready: float  # process start to READY=1
    leading: float  # process start to every schedule version recorded
    lags: tuple  # LAG_SQL's row
    peak_rss_mib: float
    cpu_start: float  # daemon CPU seconds from its start to every schedule adopted
    cpu_burst: float  # daemon CPU seconds from then to the first burst decided


class ReadySocket:
    """A $NOTIFY_SOCKET of our own: the instant the daemon says READY=1."""

    def __init__(self, root: Path) -> None:
        self.path = root / "notify.sock"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.ready_at: float | None = None
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        while self.ready_at is None:
            try:
                data = self.sock.recv(4096)
            except OSError:
                return
            if b"READY=1" in data.split(b"\n"):
                self.ready_at = time.monotonic()

    def close(self) -> None:
        self.sock.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used (/proc/PID/stat): what it costs, whatever the
    load on the box."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the process's resident-set high-water mark since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def bench_cronkeeper(pg: PrivatePostgres, n: int, root: Path, per_file: int, form: str,
                     calendar: int = 0) -> Result:
    schema = pg.new_schema()
    files = root / "schedules"
    write_files(files, n, per_file, form, calendar=calendar)
    daemon = Daemon(url=pg.url, schema=schema, cluster="bench", schedules=files,
                    instance_id="bench-leader", log_dir=root, leader_timeout=10,
                    stall_timeout=60)
    db = set_path(pg.connect(), schema)
    ready = ReadySocket(root)
    os.environ["NOTIFY_SOCKET"] = str(ready.path)
    started = time.monotonic()
    try:
        daemon.start()
    finally:
        del os.environ["NOTIFY_SOCKET"]
    try:
        wait_for(lambda: db.execute("SELECT count(*) FROM schedule_versions").fetchone()[0] >= n,
                 300, f"{n} schedules adopted", interval=0.05)
        leading = time.monotonic() - started
        cpu_start = cpu_seconds(daemon.pid)
        wait_for(lambda: ready.ready_at is not None, 60, "READY=1")
        assert ready.ready_at is not None
        active_from = db.execute("SELECT max(active_from) FROM schedule_versions").fetchone()[0]
        print(f"cronkeeper {n}: READY=1 {ready.ready_at - started:.2f} s after start, "
              f"every schedule adopted {leading:.2f} s after start", flush=True)
        # The first instant at least SETTLE s after adoption ended: an instant that fell due
        # while the versions were still being recorded (a slow start) is decided meanwhile,
        # and its lag would measure the start, not a burst.
        epoch = max(active_from.timestamp(), db_now(db).timestamp() + SETTLE)
        due = datetime.fromtimestamp((math.floor(epoch / EVERY) + 1) * EVERY, active_from.tzinfo)
        print(f"cronkeeper {n}: burst at {due.isoformat()} "
              f"({(due - db_now(db)).total_seconds():.1f} s from now)", flush=True)
        wait_for(lambda: db.execute("SELECT count(*) FROM periods WHERE scheduled_for = %s",
                                    (due,)).fetchone()[0] >= n,
                 EVERY + 300, "the whole burst decided", interval=0.2)
        cpu_burst = cpu_seconds(daemon.pid) - cpu_start
        row = db.execute(LAG_SQL.format(due="scheduled_for", start="created_at", table="outbox",
                                        where="scheduled_for = %s"), (due,)).fetchone()
        jobs = db.execute("SELECT count(*), count(DISTINCT idempotency_key) FROM outbox "
                          "WHERE scheduled_for = %s", (due,)).fetchone()
        txs = db.execute("SELECT count(DISTINCT xmin::text) FROM outbox WHERE scheduled_for = %s",
                         (due,)).fetchone()[0]
        if jobs[0] != n or jobs[1] != n:
            raise SystemExit(f"expected {n} jobs with distinct keys, found {jobs}")
        print(f"cronkeeper {n}: {jobs[0]} jobs committed ({jobs[1]} distinct keys) "
              f"in {txs} transaction(s)", flush=True)
        # the next instant too, so the peak covers a steady burst, not only the first one
        nxt = due + timedelta(seconds=EVERY)
        wait_for(lambda: db.execute("SELECT count(*) FROM periods WHERE scheduled_for = %s",
                                    (nxt,)).fetchone()[0] >= n,
                 EVERY + 300, "the second burst decided", interval=0.2)
        rss = peak_rss_mib(daemon.pid)
        return Result(n, ready.ready_at - started, leading, row, rss, cpu_start, cpu_burst)
    finally:
        ready.close()
        daemon.stop(60)
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


def machine_speed() -> str:
    """A yardstick for comparing runs made on different days: a shared virtual machine's CPU
    speed moves by more than these figures' differences (about 2x between two days here)."""
    best = math.inf
    for _ in range(3):
        start = time.process_time()
        sum(range(10_000_000))
        best = min(best, time.process_time() - start)
    return f"yardstick sum(range(10**7)): {best * 1000:.0f} ms CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("counts", type=int, nargs="*", metavar="N",
                        help="schedule counts, as --schedules (which they replace when given)")
    parser.add_argument("--schedules", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--peer-at", type=int, default=10_000,
                        help="run APScheduler at this count (0: never)")
    parser.add_argument("--per-file", type=int, default=1000)
    parser.add_argument("--form", choices=["cron6", "every"], default="cron6")
    parser.add_argument("--aps-threads", type=int, default=100,
                        help="APScheduler's executor threads (its best measured here; see above)")
    parser.add_argument("--fsync", choices=["on", "off"], default="on")
    parser.add_argument("--skip-apscheduler", action="store_true")
    parser.add_argument("--calendar", type=int, default=0, metavar="DATES",
                        help="every schedule names a calendar of this many dates (not today)")
    args = parser.parse_args()
    if args.counts:
        args.schedules = args.counts
    if any(n < 1 for n in args.schedules):
        parser.error("schedule counts must be positive")
    logging.getLogger("apscheduler").setLevel(logging.ERROR)

    results: list[Result] = []
    peer: tuple[int, tuple] | None = None
    for n in args.schedules:
        pg = PrivatePostgres(fsync=args.fsync == "on",
                             settings={"track_commit_timestamp": "on"}).start()
        root = Path(tempfile.mkdtemp(prefix="cronkeeper-burst-"))
        try:
            result = bench_cronkeeper(pg, n, root, args.per_file, args.form, args.calendar)
            print_lags(f"cronkeeper {n}", result.lags, "transaction start (created_at)")
            results.append(result)
            if n == args.peer_at and not args.skip_apscheduler:
                aps = bench_apscheduler(pg, n, args.aps_threads)
                print_lags(f"APScheduler {n} ({args.aps_threads} threads)", aps,
                           "insert (clock_timestamp)")
                peer = (n, aps)
        finally:
            pg.stop()
            shutil.rmtree(root, ignore_errors=True)

    calendar = f" naming a calendar of {args.calendar} dates" if args.calendar else ""
    print(f"\nfsync={args.fsync}, {args.form} schedules{calendar}, {args.per_file} per file, all due in "
          f"one second; load average {os.getloadavg()[0]:.2f}; {machine_speed()}")
    print("| schedules | start to ready | start to leading | fire lag p50 | fire lag p99 "
          "| all jobs visible | daemon peak RSS | daemon CPU: start, burst |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        p50, p99, worst = r.lags[:3]
        print(f"| {r.schedules:,} | {r.ready:.2f} s | {r.leading:.2f} s | {p50 * 1000:,.0f} ms "
              f"| {p99 * 1000:,.0f} ms | {worst:.2f} s | {r.peak_rss_mib:.0f} MiB "
              f"| {r.cpu_start:.2f} s, {r.cpu_burst:.2f} s |")
    if peer is not None:
        n, aps = peer
        print(f"| APScheduler {n:,} | | | {aps[0] * 1000:,.0f} ms | {aps[1] * 1000:,.0f} ms "
              f"| {aps[2]:.2f} s | | |")
        ck = next(r for r in results if r.schedules == n)
        print(f"ratio at {n:,} (APScheduler / cronkeeper): p50 {aps[0] / ck.lags[0]:.1f}x, "
              f"p99 {aps[1] / ck.lags[1]:.1f}x, max {aps[2] / ck.lags[2]:.1f}x")
    for r in results[1:]:
        base = results[0]
        print(f"{r.schedules:,} vs {base.schedules:,}: {r.schedules / base.schedules:.0f}x the "
              f"schedules, p99 {r.lags[1] / base.lags[1]:.1f}x, peak RSS "
              f"{r.peak_rss_mib / base.peak_rss_mib:.1f}x, periods/s to the last commit "
              f"{base.schedules / base.lags[2]:,.0f} -> {r.schedules / r.lags[2]:,.0f}")


if __name__ == "__main__":
    main()

