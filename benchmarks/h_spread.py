"""What ``H`` does to a burst: N schedules written ``H`` against the same N written ``0``, all due
in one minute, through one leader and W workers (docs/schedules.md, "How H spreads a burst").

The issue's case is 100,000 schedules ``H 6 * * *`` against ``0 6 * * *``: one hour, spread to
the minute. Scaled down by 60 so that it runs in minutes and not at 06:00: ``H M h * * *``
against ``0 M h * * *`` (six fields: a hashed second of one minute M, against its second 0),
M chosen ``--lead`` seconds ahead of the start. Each form runs against a private PostgreSQL of
its own (tests/daemon_harness.py; fsync on, ``track_commit_timestamp = on``), one `cronkeeper
run` (the leader, at its defaults but ``--metrics-address off``) and ``--workers`` `cronkeeper
worker` processes at their defaults, running a no-op task (``bench.noop``, which
benchmarks/worker_throughput.py registers).
The workers start once every schedule is adopted, before M.

Per form, over the N periods of minute M:
- fire lag: the commit time of the transaction that claimed the period and wrote its job
  (``pg_xact_commit_timestamp`` of the ``periods`` row, written once) minus ``scheduled_for``;
- job wait: the job's first attempt's ``started_at`` minus ``scheduled_for`` (how long a due job
  waited for a worker: the herd);
- drain: the last job's ``finished_at`` minus M (the minute's first due instant), and minus the
  minute's last due instant;
- the leader's CPU from M - 1 s to the last period decided.

    .venv/bin/python benchmarks/h_spread.py [--schedules 100000] [--workers 2] [--lead 120]
        [--forms 0 H]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from burst_vs_apscheduler import cpu_seconds, machine_speed, write_files  # noqa: E402
from daemon_harness import CRONKEEPER, Daemon, PrivatePostgres, db_now, set_path, wait_for  # noqa: E402

TASK = "bench.noop"  # the no-op handler worker_throughput.py registers for the workers
STATS_SQL = """
SELECT count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY fire), percentile_cont(0.99) WITHIN GROUP
       (ORDER BY fire), max(fire),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY wait), percentile_cont(0.99) WITHIN GROUP
       (ORDER BY wait), max(wait),
       max(finished) - %(m)s, max(finished) - max(due), count(DISTINCT due)
FROM (SELECT extract(epoch FROM p.scheduled_for) AS due,
             extract(epoch FROM pg_xact_commit_timestamp(p.xmin) - p.scheduled_for) AS fire,
             extract(epoch FROM a.started_at - o.scheduled_for) AS wait,
             extract(epoch FROM o.finished_at) AS finished
      FROM periods p
      JOIN outbox o ON o.schedule = p.schedule AND o.scheduled_for = p.scheduled_for
      JOIN attempts a ON a.job_id = o.id AND a.attempt = 1
      WHERE p.scheduled_for >= to_timestamp(%(m)s) AND p.scheduled_for < to_timestamp(%(m)s) + '1 minute') s
"""


def spawn_workers(url: str, schema: str, count: int, log_dir: Path) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    procs = []
    for i in range(count):
        log = open(log_dir / f"worker-{i}.log", "a")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(
            [CRONKEEPER, "worker", "--database-url", url, "--schema", schema, "--cluster", "bench",
             "--import", "worker_throughput", "--instance-id", f"bench-worker-{i}",
             "--metrics-address", "off", "--log-level", "warning"],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL))  # fmt: skip
    return procs


def run_form(form: str, n: int, workers: int, lead: float, per_file: int) -> dict:
    pg = PrivatePostgres(fsync=True, settings={"track_commit_timestamp": "on"}).start()
    root = Path(tempfile.mkdtemp(prefix="cronkeeper-h-spread-"))
    procs: list[subprocess.Popen] = []
    daemon = None
    db = None
    try:
        schema = pg.new_schema()
        db = set_path(pg.connect(), schema)
        now = db_now(db)
        minute = math.ceil((now.timestamp() + lead) / 60) * 60
        at = datetime.fromtimestamp(minute, now.tzinfo)
        cron = f"{form} {at.minute} {at.hour} * * *"
        write_files(root / "schedules", n, per_file, cron=cron, task=TASK)
        daemon = Daemon(url=pg.url, schema=schema, cluster="bench", schedules=root / "schedules",
                        instance_id="bench-leader", log_dir=root, leader_timeout=10,
                        stall_timeout=60)  # fmt: skip
        started = time.monotonic()
        daemon.start()
        wait_for(lambda: db.execute("SELECT count(*) FROM schedule_versions").fetchone()[0] >= n,
                 lead + 300, f"{n} schedules adopted", interval=0.2)
        adopted = time.monotonic() - started
        left = minute - db_now(db).timestamp()
        print(f"{form!r}: cron {cron!r}; {n} schedules adopted in {adopted:.1f} s, {left:.1f} s "
              f"before the minute", flush=True)
        if left < 5:
            raise SystemExit("adoption ended less than 5 s before the minute: rerun with a larger "
                             "--lead")
        procs = spawn_workers(pg.url, schema, workers, root)
        wait_for(lambda: db_now(db).timestamp() >= minute - 1, left + 5, "the minute", interval=0.1)
        cpu_before = cpu_seconds(daemon.pid)
        wait_for(lambda: db.execute(
            "SELECT count(*) FROM periods WHERE scheduled_for >= to_timestamp(%s) AND "
            "scheduled_for < to_timestamp(%s) + '1 minute'", (minute, minute)).fetchone()[0] >= n,
            600, "every period of the minute decided", interval=0.2)  # fmt: skip
        cpu_leader = cpu_seconds(daemon.pid) - cpu_before
        wait_for(lambda: db.execute(
            "SELECT count(*) FROM outbox WHERE state = 'succeeded' AND scheduled_for >= "
            "to_timestamp(%s) AND scheduled_for < to_timestamp(%s) + '1 minute'",
            (minute, minute)).fetchone()[0] >= n, 900, "every job of the minute done",
            interval=0.2)  # fmt: skip
        row = db.execute(STATS_SQL, {"m": minute}).fetchone()
        if row[0] != n:
            raise SystemExit(f"{form!r}: {row[0]} periods with a finished job, expected {n}")
        return {"form": form, "cron": cron, "n": n, "adopted": adopted, "fire_p50": row[1],
                "fire_p99": row[2], "fire_max": row[3], "wait_p50": row[4], "wait_p99": row[5],
                "wait_max": row[6], "drain": row[7], "drain_after_last": row[8],
                "instants": row[9], "leader_cpu": cpu_leader}  # fmt: skip
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        if daemon is not None:
            daemon.stop(60)
        if db is not None:
            db.close()
        pg.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2, help="cronkeeper worker processes")
    parser.add_argument("--lead", type=float, default=120,
                        help="seconds from the start to the minute measured (adoption must end "
                             "before it)")  # fmt: skip
    parser.add_argument("--per-file", type=int, default=1000)
    parser.add_argument("--forms", nargs="+", choices=["0", "H"], default=["0", "H"])
    args = parser.parse_args()
    results = [run_form(form, args.schedules, args.workers, args.lead, args.per_file)
               for form in args.forms]  # fmt: skip
    print(f"\n{args.schedules:,} schedules, {args.workers} workers, fsync on; load average "
          f"{os.getloadavg()[0]:.2f}; {machine_speed()}")
    print("| second field | due instants | fire lag p50 / p99 / max | job wait p50 / p99 / max "
          "| drain from the minute / after its last due instant | leader CPU |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| `{r['form']}` | {r['instants']} | {r['fire_p50']:.2f} / {r['fire_p99']:.2f} / "
              f"{r['fire_max']:.2f} s | {r['wait_p50']:.2f} / {r['wait_p99']:.2f} / "
              f"{r['wait_max']:.2f} s | {r['drain']:.1f} s / {r['drain_after_last']:.1f} s "
              f"| {r['leader_cpu']:.2f} s |")
    if len(results) == 2:
        zero, spread = results
        print(f"H / 0: fire lag p99 {spread['fire_p99'] / zero['fire_p99']:.2f}x, job wait p99 "
              f"{spread['wait_p99'] / zero['wait_p99']:.2f}x")


if __name__ == "__main__":
    main()
