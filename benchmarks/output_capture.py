"""What keeping a job's output costs: the same jobs with their output captured and stored, and
with it discarded, drained by the same running workers in one run, in alternating rounds.

    .venv/bin/python benchmarks/output_capture.py --jobs 10000 --workers 2 \\
        --database-url postgresql://postgres@127.0.0.1:5432/test [--only commands,handlers]

Two parts, each on a fresh schema (``bench_output``), with ``--workers`` ``cronkeeper worker``
processes at their defaults, started once and kept running for every round of the part:

- ``commands``: command jobs running ``/bin/cat`` of a 1 KiB file (16 lines of 64 bytes). Two
  schedules identical but for ``output_limit``: the default (64 KiB: each attempt's 1 KiB is
  read from the pipe and written with the attempt) and ``"0B"`` (stdout and stderr to
  /dev/null, nothing kept).
- ``handlers``: a task handler that logs 10 lines through ``logging`` (about 105 bytes each as
  kept). Two task schedules (in the workers' ``--schedules``), the default limit and ``"0B"``.
  With ``0B`` the records are still made and reach the root logger (the worker lowers an
  untouched root to INFO so that they could be kept), and are dropped there: the cheapest a
  discarded record can be, so the comparison is the harshest for capture. The worker's own
  part of it (formatting and keeping the records) is measured apart, without the database or
  the machine's noise, by benchmarks/log_capture_cost.py.
- ``handlers-logged``: the same, in an application that configured logging itself
  (``logging.basicConfig(level=INFO, filename=...)``, here /dev/null): every record is
  formatted and written by the application's handler in both modes, as an application that
  logs 10 lines a job has its lines go somewhere; capture keeps them besides.

Each part runs ``--rounds`` rounds per mode (``--jobs`` jobs per mode in all), in the order
A B B A A B B A ... (so that a drift of the machine's load over the run weighs on both modes
alike), after one untimed warm-up round of each. A round's jobs are inserted in one
transaction that also wakes the workers (``pg_notify``), and the round lasts from that commit
until no job of it is left ``available`` or ``running`` (checked every 10 ms on an index).
Printed per mode: jobs/s over all its rounds, and the CPU the workers and their PostgreSQL
backends spent per job (from /proc, as benchmarks/worker_throughput.py measures it); then the
ratios capture / discard. Throughput is what the issue bounds (at most 5 % lost); CPU per job is
the steadier figure on a loaded machine.

The claim path: while the rounds run, a probe claims one job of its own (a task the workers do
not take) every 10 ms with the workers' claim statement (``outbox_claim``) and completes it,
timing each claim. Its p50 and p99 per mode say whether writing output slows the claims that
run beside it (the claim statement itself is unchanged: it inserts attempt rows without output).
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
from pathlib import Path

import psycopg

HERE = Path(__file__).resolve().parent
SCHEMA = "bench_output"
POLL = 0.01

try:  # the handler: imported by `cronkeeper worker --import output_capture`
    import logging

    from cronkeeper.worker import task as _task

    _log = logging.getLogger("bench.output")
    if os.environ.get("BENCH_OUTPUT_LOG_TO"):  # the part handlers-logged: the application's own
        logging.basicConfig(level=logging.INFO, filename=os.environ["BENCH_OUTPUT_LOG_TO"],
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    @_task("bench.log10")
    def bench_log10(payload, ctx):  # noqa: ANN001, ARG001
        for i in range(10):
            _log.info("bench line %d of job %s: something worth keeping", i, ctx.key)
except ImportError:  # pragma: no cover
    pass

from worker_throughput import CpuMeter, conninfo  # noqa: E402 - after the handler's definition

MODES = ("capture", "discard")
PARTS = ("commands", "handlers", "handlers-logged")
PREFIX = {"commands": "cmd", "handlers": "log", "handlers-logged": "log"}  # schedules: PREFIX-mode
COMMON = ('every = "1h"\ntimezone = "UTC"\nmisfire = "skip"\nowner = "bench"\n'
          'max_attempts = 1\ntimeout = "1m"\n')


def schedule_files(directory: Path, payload_file: Path) -> None:
    """Per part and mode one schedule, the two of a part identical but for output_limit."""
    cat = json.dumps(["/bin/cat", str(payload_file)])
    limits = {"capture": "", "discard": 'output_limit = "0B"\n'}
    text = ""
    for mode in MODES:
        text += f"[cmd-{mode}]\n{COMMON}command = {cat}\n{limits[mode]}\n"
        text += f"[log-{mode}]\n{COMMON}task = \"bench.log10\"\n{limits[mode]}\n"
    (directory / "bench.toml").write_text(text)


def prepare(url: str, directory: Path) -> dict[str, int]:
    """A fresh schema; the command schedules' versions as the leader records them."""
    from cronkeeper import clock
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.migrate import migrate
    from cronkeeper.schedule import load_valid

    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    engine = make_engine(normalize_url(url), "public", pool_size=1)
    migrate(engine, SCHEMA)
    engine.dispose()
    specs = load_valid([str(directory)], now=clock.wall()).by_name()
    versions = {}
    with psycopg.connect(conninfo(url, SCHEMA), autocommit=True) as conn:
        for mode in MODES:
            spec = specs[f"cmd-{mode}"]
            versions[mode] = conn.execute(
                "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
                "VALUES (%s, %s, %s, now() - interval '1 day', 1) RETURNING id",
                (spec.name, spec.digest, json.dumps(spec.to_json()))).fetchone()[0]
    return versions


def insert_round(conn: psycopg.Connection, part: str, mode: str, jobs: int, first: int,
                 versions: dict[str, int]) -> float:
    """One round's jobs in one transaction that wakes the workers; the instant it committed."""
    with conn.transaction():
        if part == "commands":
            conn.execute(
                "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, "
                "max_attempts, timeout_seconds) SELECT %(s)s || '@' || i, %(s)s, "
                "timestamptz '2026-01-01' + i * interval '1 second', %(v)s, 'command', 1, 60 "
                "FROM generate_series(%(a)s::int, %(b)s::int) i",
                {"s": f"cmd-{mode}", "v": versions[mode], "a": first, "b": first + jobs - 1})
        else:
            conn.execute(
                "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, task, max_attempts)"
                " SELECT %(s)s || '@' || i, %(s)s, timestamptz '2026-01-01' + i * interval "
                "'1 second', 'bench.log10', 1 FROM generate_series(%(a)s::int, %(b)s::int) i",
                {"s": f"log-{mode}", "a": first, "b": first + jobs - 1})
        conn.execute(f"SELECT pg_notify('cronkeeper.{SCHEMA}', '')")
    return time.monotonic()


def drained(conn: psycopg.Connection, schedule: str, procs: list[subprocess.Popen]) -> float:
    while True:
        if not conn.execute("SELECT EXISTS (SELECT 1 FROM outbox WHERE state IN ('available', "
                            "'running') AND schedule = %s)", (schedule,)).fetchone()[0]:
            return time.monotonic()
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a worker exited: {[p.poll() for p in procs]}")
        time.sleep(POLL)


class ClaimProbe(threading.Thread):
    """Claims one job of its own every 10 ms with ``outbox_claim``, timing the statement, and
    files each timing under the mode of the round running at that moment."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        from cronkeeper.db.engine import make_engine, normalize_url

        self.engine = make_engine(normalize_url(url), SCHEMA, pool_size=1)
        self.mode: str | None = None
        self.times: dict[str, list[float]] = {m: [] for m in MODES}
        self.stop = threading.Event()

    def run(self) -> None:
        from cronkeeper.db.outbox_claims import outbox_claim
        from cronkeeper.db.outbox_endings import outbox_complete

        n = 0
        with self.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            while not self.stop.wait(0.01):
                mode = self.mode
                if mode is None:
                    continue
                n += 1
                conn.exec_driver_sql("INSERT INTO outbox (idempotency_key, task) VALUES "
                                     "(%(k)s, 'bench.probe')", {"k": f"probe-{n}"})
                start = time.perf_counter()
                jobs = outbox_claim(conn, worker_id="probe", limit=1, lease_margin=30,
                                    tasks=["bench.probe"])
                took = time.perf_counter() - start
                if self.mode == mode:
                    self.times[mode].append(took)
                outbox_complete(conn, worker_id="probe", ids=[j.id for j in jobs],
                                attempts=[j.attempt for j in jobs])
        self.engine.dispose()


def run_part(url: str, part: str, args: argparse.Namespace, directory: Path,
             versions: dict[str, int]) -> dict[str, tuple[float, float, float, list[float]]]:
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    if part == "handlers-logged":
        env["BENCH_OUTPUT_LOG_TO"] = os.devnull
    task = "command" if part == "commands" else "bench.log10"
    procs = [subprocess.Popen(
        [exe, "worker", "--database-url", url, "--schema", SCHEMA, "--schedules", str(directory),
         "--import", "output_capture", "--task", task, "--log-level", "warning",
         "--instance-id", f"bench-{i}", "--metrics-address", "off"], env=env)
        for i in range(args.workers)]
    probe = ClaimProbe(url)
    probe.start()
    jobs_per_mode = args.jobs if part == "commands" else args.handler_jobs
    per_round = max(1, jobs_per_mode // args.rounds)
    order = [MODES[(i + 1) // 2 % 2] for i in range(2 * args.rounds)]  # A B B A A B B A ...
    totals = {m: [0.0, 0.0, 0.0] for m in MODES}  # seconds, worker CPU s, server CPU s
    rounds: list[tuple[str, float, float]] = []  # (mode, jobs/s, CPU s per job) of each round
    first = 1
    try:
        with psycopg.connect(conninfo(url, SCHEMA), autocommit=True) as conn:
            meter = CpuMeter(procs)
            for mode in MODES:  # warm-up: start-up, first connections, imports (not counted)
                insert_round(conn, part, mode, min(per_round, 200), first, versions)
                first += per_round
                drained(conn, f"{PREFIX[part]}-{mode}", procs)
            for mode in order:
                meter.sample(conn)
                before = meter.totals()
                probe.mode = mode
                start = insert_round(conn, part, mode, per_round, first, versions)
                end = drained(conn, f"{PREFIX[part]}-{mode}", procs)
                probe.mode = None
                first += per_round
                meter.sample(conn)
                after = meter.totals()
                totals[mode][0] += end - start
                totals[mode][1] += after[0] - before[0]
                totals[mode][2] += after[1] - before[1]
                rounds.append((mode, per_round / (end - start),
                               (after[0] - before[0] + after[1] - before[1]) / per_round))
                print(f"  {part} {mode:8s} {per_round} jobs in {end - start:6.3f} s "
                      f"({per_round / (end - start):7.0f} jobs/s); load {os.getloadavg()[0]:.1f}",
                      flush=True)
            check(conn, part)
    finally:
        probe.stop.set()
        probe.join(10)
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    jobs = per_round * args.rounds
    # Each two rounds in a row are one of each mode (A B, B A, ...): their ratio is taken in the
    # same minute of the machine's load; the median of those ratios shrugs off a round that
    # someone else's burst hit, which the totals do not.
    pairs = [(a, b) if a[0] == "capture" else (b, a) for a, b in zip(rounds[::2], rounds[1::2], strict=True)]
    print(f"  {part}: capture / discard per pair of rounds, median (min-max): throughput "
          f"{spread([c[1] / d[1] for c, d in pairs])}, CPU per job "
          f"{spread([c[2] / d[2] for c, d in pairs])}", flush=True)
    return {m: (jobs / totals[m][0], totals[m][1] / jobs, totals[m][2] / jobs, probe.times[m])
            for m in MODES}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def check(conn: psycopg.Connection, part: str) -> None:
    """Every job succeeded; captured attempts kept their output, discarded ones nothing."""
    prefix = PREFIX[part]
    rows = conn.execute(
        "SELECT o.schedule, o.state, count(*), count(a.output), min(octet_length(a.output)), "
        "max(octet_length(a.output)) FROM outbox o JOIN attempts a ON a.job_id = o.id "
        "WHERE o.schedule LIKE %s GROUP BY 1, 2 ORDER BY 1, 2", (f"{prefix}-%",)).fetchall()
    for schedule, state, count, kept, low, high in rows:
        if state != "succeeded":
            raise SystemExit(f"{schedule}: {count} jobs {state}")
        if schedule.endswith("capture") and (kept != count or not low):
            raise SystemExit(f"{schedule}: {kept} of {count} attempts kept output")
        if schedule.endswith("discard") and kept:
            raise SystemExit(f"{schedule}: {kept} attempts kept output")
        print(f"  checked {schedule}: {count} succeeded, {kept} with output"
              + (f" of {low}-{high} bytes" if kept else ""), flush=True)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=10_000, help="command jobs per mode")
    parser.add_argument("--handler-jobs", type=int, default=10_000,
                        help="handler jobs per mode (each part)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds per mode")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--keep", action="store_true", help="keep the schema")
    args = parser.parse_args()
    url = args.database_url
    load = os.getloadavg()
    print(f"load before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (1, 5, 15 min); "
          f"{args.workers} worker processes; per mode {args.jobs} command jobs and "
          f"{args.handler_jobs} handler jobs, each in {args.rounds} rounds",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "schedules"
        directory.mkdir()
        payload = Path(tmp) / "one-kib.txt"
        payload.write_bytes(b"".join(b"%02d " % i + b"x" * 60 + b"\n" for i in range(16)))
        assert payload.stat().st_size == 1024
        schedule_files(directory, payload)
        for part in [p.strip() for p in args.only.split(",") if p.strip()]:
            if part not in PARTS:
                parser.error(f"--only: unknown part {part!r}")
            versions = prepare(url, directory)
            try:
                result = run_part(url, part, args, directory, versions)
            finally:
                if not args.keep:
                    with psycopg.connect(conninfo(url), autocommit=True) as conn:
                        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
            for mode, (rate, worker_cpu, server_cpu, claims) in result.items():
                print(f"{part:8s} {mode:8s} {rate:8.0f} jobs/s; CPU per job: workers "
                      f"{worker_cpu * 1e6:5.0f} us + PostgreSQL {server_cpu * 1e6:4.0f} us; probe "
                      f"claims: {len(claims)}, p50 {pct(claims, 0.5) * 1e3:.2f} ms, p99 "
                      f"{pct(claims, 0.99) * 1e3:.2f} ms", flush=True)
            cap, dis = result["capture"], result["discard"]
            print(f"{part:8s} capture / discard: throughput {cap[0] / dis[0]:.3f}, CPU per job "
                  f"{(cap[1] + cap[2]) / (dis[1] + dis[2]):.3f}, claim p50 "
                  f"{statistics.median(cap[3]) / statistics.median(dis[3]):.2f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
