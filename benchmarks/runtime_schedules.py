"""Runtime schedules at scale (SPEC §15; docs/runtime-schedules.md), in one run:

1. ``put_many`` of 10,000 specs in one transaction (target: under 2 s), and the same 10,000
   put again unchanged (writes nothing);
2. a daemon with 100,000 runtime schedules beside one with the same 100,000 in files: process
   start to READY=1 (systemd's), start to leading (every schedule in force: ``action=leading``),
   and its memory (VmRSS once leading, VmHWM: the peak), on a first start (versions recorded)
   and on a restart (versions read back);
3. adoption latency of single puts (each its own transaction) while a leader runs 10,000
   runtime schedules that fire every minute: commit returned to the version recorded (seen by
   a poll of the database every 2 ms), p50 / p99 / max.

    .venv/bin/python benchmarks/runtime_schedules.py [--schedules 100000] [--puts 200]

A private PostgreSQL (tests/daemon_harness.py), started and stopped here.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg  # noqa: E402
from burst_vs_apscheduler import ReadySocket, cpu_seconds  # noqa: E402
from daemon_harness import Daemon, PrivatePostgres, set_path, wait_for  # noqa: E402

from cronkeeper import schedules  # noqa: E402


def spec(i: int) -> dict:
    return {"cron": "H * * * *", "timezone": "UTC", "misfire": "skip", "overlap": "allow",
            "task": "bench.tenant", "payload": {"tenant": i}, "owner": "bench"}


def toml(i: int) -> str:
    return (f'[tenant-{i:06d}]\ncron = "H * * * *"\ntimezone = "UTC"\nmisfire = "skip"\n'
            f'overlap = "allow"\ntask = "bench.tenant"\npayload = {{ tenant = {i} }}\n'
            'owner = "bench"\n')


SERVER_CPU: list[float] = []  # the server backend's CPU seconds of each put_many


def put_in_chunks(pg: PrivatePostgres, schema: str, n: int, chunk: int = 10_000) -> list[float]:
    took = []
    for start in range(0, n, chunk):
        specs = {f"tenant-{i:06d}": spec(i) for i in range(start, min(n, start + chunk))}
        with psycopg.connect(pg.url) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            before = cpu_seconds(backend)
            t = time.perf_counter()
            schedules.put_many(conn, specs, schema=schema)
            conn.commit()
            took.append(time.perf_counter() - t)
            SERVER_CPU.append(cpu_seconds(backend) - before)
    return took


def memory(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found["VmRSS"], found["VmHWM"]


def run_daemon(pg: PrivatePostgres, schema: str, files: Path, root: Path, label: str,
               n: int) -> list[tuple[str, float, float, float, float, float]]:
    """Start, wait for leading, measure; restart, the same. Rows: (start, ready, leading, rss,
    hwm, daemon CPU seconds to leading)."""
    rows = []
    for start in ("first start", "restart"):
        daemon = Daemon(url=pg.url, schema=schema, cluster=f"b-{label}", schedules=files,
                        instance_id=f"bench-{label}", log_dir=root, leader_timeout=30,
                        stall_timeout=120)
        sock_dir = root / f"{label}-{start.replace(' ', '-')}"
        sock_dir.mkdir()
        ready = ReadySocket(sock_dir)
        os.environ["NOTIFY_SOCKET"] = str(ready.path)
        began = time.monotonic()
        try:
            daemon.start()
        finally:
            del os.environ["NOTIFY_SOCKET"]
        try:
            record = daemon.wait_log(lambda r: r.get("action") == "leading", 600, "leading")
            leading = time.monotonic() - began
            cpu = cpu_seconds(daemon.pid)
            wait_for(lambda ready=ready: ready.ready_at is not None, 60, "READY=1")
            assert ready.ready_at is not None
            time.sleep(2)  # a tick or two in force
            rss, hwm = memory(daemon.pid)
            rows.append((start, ready.ready_at - began, leading, rss, hwm, cpu))
            print(f"{label:>7} {start:<11}: READY=1 {ready.ready_at - began:6.2f} s, leading "
                  f"{leading:6.2f} s ({record.get('message')}; {cpu:.1f} s of daemon CPU), "
                  f"RSS {rss:6.0f} MiB, peak {hwm:6.0f} MiB", flush=True)
        finally:
            ready.close()
            daemon.stop(120)
    with set_path(pg.connect(), schema) as db:
        versions = db.execute("SELECT count(*) FROM schedule_versions").fetchone()[0]
    assert versions >= n, f"{label}: only {versions} versions recorded"
    return rows


def adoption(pg: PrivatePostgres, root: Path, puts: int) -> list[float]:
    schema = pg.new_schema()
    empty = root / "empty"
    empty.mkdir(exist_ok=True)
    with psycopg.connect(pg.url) as conn:
        schedules.put_many(conn, {f"burst-{i:05d}": {
            "cron": "* * * * *", "timezone": "UTC", "misfire": "skip", "overlap": "allow",
            "task": "bench.burst", "owner": "bench"} for i in range(10_000)}, schema=schema)
        conn.commit()
    daemon = Daemon(url=pg.url, schema=schema, cluster="b-adopt", schedules=empty,
                    instance_id="bench-adopt", log_dir=root, leader_timeout=30, stall_timeout=60)
    daemon.start()
    latencies = []
    rng = random.Random(22)
    try:
        daemon.wait_log(lambda r: r.get("action") == "leading", 300, "leading")
        poll = set_path(pg.connect(), schema)
        with psycopg.connect(pg.url) as app:
            for i in range(puts):
                time.sleep(rng.uniform(0.05, 0.3))  # puts at every phase of the minute's burst
                version = schedules.put(app, f"single-{i:05d}", {
                    "every": "1h", "timezone": "UTC", "misfire": "skip", "task": "bench.single",
                    "owner": "bench"}, schema=schema)
                app.commit()
                committed = time.perf_counter()
                while not poll.execute("SELECT 1 FROM schedule_versions WHERE id = %s",
                                       (version,)).fetchone():
                    time.sleep(0.002)
                    if time.perf_counter() - committed > 30:
                        raise SystemExit(f"put {i} not adopted within 30 s")
                latencies.append(time.perf_counter() - committed)
        poll.close()
    finally:
        daemon.stop(60)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--puts", type=int, default=200)
    args = parser.parse_args()
    pg = PrivatePostgres().start()
    root = Path(tempfile.mkdtemp(prefix="cronkeeper-runtime-bench-"))
    try:
        # 1. put_many of 10,000 (three times each: the machine is shared and noisy)
        print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
        for _ in range(3):
            schema = pg.new_schema()
            cpu = time.process_time()
            first = put_in_chunks(pg, schema, 10_000)[0]
            cpu = time.process_time() - cpu
            server = SERVER_CPU[-1]
            again = put_in_chunks(pg, schema, 10_000)[0]
            print(f"put_many 10,000: {first:.2f} s wall (CPU: {cpu:.2f} s here, validation "
                  f"and JSON, + {server:.2f} s in the server's backend = {cpu + server:.2f} s; "
                  f"target < 2 s); the same again, unchanged: {again:.2f} s wall, "
                  f"{SERVER_CPU[-1]:.2f} s server CPU (nothing written)", flush=True)

        # 2. 100,000 runtime vs files
        n = args.schedules
        files_dir = root / "files"
        files_dir.mkdir()
        per_file = 1000
        for f in range(0, n, per_file):
            (files_dir / f"t-{f // per_file:04d}.toml").write_text(
                "\n".join(toml(i) for i in range(f, min(n, f + per_file))))
        file_rows = run_daemon(pg, pg.new_schema(), files_dir, root, "files", n)
        runtime_schema = pg.new_schema()
        took = put_in_chunks(pg, runtime_schema, n)
        print(f"put_many of {n:,} in chunks of 10,000: {sum(took):.1f} s "
              f"(each {min(took):.2f}-{max(took):.2f} s)", flush=True)
        empty = root / "no-files"
        empty.mkdir()
        runtime_rows = run_daemon(pg, runtime_schema, empty, root, "runtime", n)
        print(f"\n{n:,} schedules: runtime / files")
        for (start, ready_f, lead_f, rss_f, hwm_f, cpu_f), (
                _, ready_r, lead_r, rss_r, hwm_r, cpu_r) in zip(file_rows, runtime_rows,
                                                                strict=True):
            print(f"  {start:<11}: READY=1 {ready_r:.2f} / {ready_f:.2f} s "
                  f"({ready_r / ready_f:.2f}x), leading {lead_r:.2f} / {lead_f:.2f} s "
                  f"({lead_r / lead_f:.2f}x; daemon CPU {cpu_r:.1f} / {cpu_f:.1f} s, "
                  f"{cpu_r / cpu_f:.2f}x), RSS {rss_r:.0f} / {rss_f:.0f} MiB "
                  f"({rss_r / rss_f:.2f}x), peak {hwm_r:.0f} / {hwm_f:.0f} MiB "
                  f"({hwm_r / hwm_f:.2f}x)", flush=True)

        # 3. adoption latency under a 10,000-schedule leader
        print(f"load average now: {os.getloadavg()[0]:.1f}", flush=True)
        lat = sorted(adoption(pg, root, args.puts))
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(f"\nadoption of {len(lat)} single puts, 10,000 runtime schedules firing every "
              f"minute: p50 {statistics.median(lat) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
              f"max {lat[-1] * 1000:.0f} ms (target p99 < 1 s)", flush=True)
    finally:
        pg.stop()


if __name__ == "__main__":
    main()
