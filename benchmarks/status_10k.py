"""How long `cronkeeper status --format json` takes with 10,000 schedules whose attempts are
recorded (issue 27 target: under 1 s, Python start-up included).

Seeds a private schema with the 10,000 schedules of ``web_render.py`` (its mix of triggers and
timezones, each schedule's 60 latest periods recorded, a job per emitted period: 600,000
periods, about 550,000 jobs), then one finished attempt per job (plus a second, timed-out one
before it on every 17th job, and every 101st schedule running close to its timeout), so each
schedule's run-time figures come from 50-60 attempts. Then it starts a real `cronkeeper run`
on those schedules (written as schedule files: the same digests, so no new version), waits until
its summarizer has summarized every schedule (docs/observability.md, "Where status's figures
come from"), and runs the real console script as a subprocess ``--runs`` times while that
leader leads (and the table format once), printing the median and the best, each run's own
CPU time and the load average; then once more after the leader has stopped (every figure
computed live, as before the summary). For the ratio within
the run it also times the document in-process both ways (the leader's summary, and every
schedule computed live, as without a leader), the CPU of a process that only imports what the
command imports (the floor no change to the reads or the document lowers), and prints the plan
(EXPLAIN ANALYZE) of the run-time statement, ``attempts_runtimes``, to name the indexes it uses, the statement's own
time, and how long migration 0009's index takes to build over these attempts.

    .venv/bin/python benchmarks/status_10k.py [--runs 5] [--schedules 10000]
        [--database-url postgresql://postgres@127.0.0.1:5432/test] [--keep] [--schema NAME]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from daemon_harness import Daemon, wait_for  # noqa: E402 - the harness lives with the tests
from web_render import kind  # noqa: E402
from web_render import seed as seed_schedules  # noqa: E402 - the 10,000-schedule seed

# Each job's attempt: 0.5-3.4 s of run time against the default timeout (600 s); every 101st
# schedule's take 500-570 s (diagnosed near its timeout); on every 13th schedule, every 17th
# job timed out once (at 600 s) before it succeeded (diagnosed too, with the count).
SEED_ATTEMPTS = """
WITH s AS (
    SELECT schedule, n % 101 = 0 AS slow, n % 13 = 0 AS flaky
    FROM (SELECT schedule, row_number() OVER (ORDER BY schedule) AS n
          FROM (SELECT DISTINCT schedule FROM schedule_versions) d) numbered
), o AS (
    UPDATE outbox SET attempts = CASE WHEN s.flaky AND outbox.id % 17 = 0 THEN 2 ELSE 1 END
    FROM s WHERE s.schedule = outbox.schedule
    RETURNING outbox.id, outbox.state, outbox.created_at, outbox.attempts, s.slow
)
INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at, outcome, error)
SELECT o.id, n, 'bench-worker', o.created_at + make_interval(secs => 700 * (n - 1)),
       o.created_at + make_interval(secs => 700 * (n - 1) + CASE
           WHEN n < o.attempts THEN 600
           WHEN o.slow THEN 500 + o.id % 70
           ELSE 0.5 + (o.id % 30) / 10.0 END),
       CASE WHEN n < o.attempts THEN 'timeout'
            WHEN o.state = 'dead' THEN 'dead' ELSE 'succeeded' END,
       CASE WHEN n < o.attempts THEN 'timed out after 600s' END
FROM o CROSS JOIN LATERAL generate_series(1, o.attempts) AS n
"""


def seed(url: str, schema: str, count: int) -> int:
    seed_schedules(url, schema, count)
    with psycopg.connect(url, options=f"-c search_path={schema}", autocommit=True) as conn:
        conn.execute(SEED_ATTEMPTS)
        conn.execute("VACUUM (ANALYZE) outbox, attempts")
        return conn.execute("SELECT count(*) FROM attempts").fetchone()[0]


def schedule_files(directory: Path, count: int) -> Path:
    """The seeded schedules as one schedule file (the seed's specs: the same digests)."""
    lines = []
    for i in range(count):
        every, cron, zone, _ = kind(i)
        lines += [f"[job-{i:05d}]", f'every = "{int(every)}s"' if every else f'cron = "{cron}"',
                  f'timezone = "{zone}"', 'misfire = "skip"', 'task = "bench.noop"',
                  f'owner = "team-{i % 7}"', ""]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "bench.toml").write_text("\n".join(lines))
    return directory


def summarized(url: str, schema: str) -> int:
    """Schedules the leader in force has summarized under its current term."""
    with psycopg.connect(url, options=f"-c search_path={schema}") as conn:
        return conn.execute(
            "SELECT count(*) FROM schedule_summaries s JOIN leadership l ON l.term = s.term "
            "AND l.released_at IS NULL").fetchone()[0]


def in_process(url: str, schema: str) -> None:
    """The document built in this process, from the leader's summary and all live: the ratio."""
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.operations.status import gather

    engine = make_engine(normalize_url(url), schema, pool_size=2)
    for use in (True, False):
        took = []
        for _ in range(2):
            start = time.perf_counter()
            doc = gather(engine, schema, "default", use_summary=use)
            took.append(time.perf_counter() - start)
        print(f"gather in-process, {'summary' if use else 'all live'}: best {min(took):.3f}s "
              f"(figures {doc['figures']['summarized']} summarized, "
              f"{doc['figures']['computed_live']} live) | {load()}")
    engine.dispose()


def explain(url: str, schema: str) -> None:
    from cronkeeper.db.attempts import RUNTIMES

    # jit off, as status's transaction has it
    with psycopg.connect(url, options=f"-c search_path={schema} -c jit=off") as conn:
        names = [r[0] for r in conn.execute(
            "SELECT DISTINCT schedule FROM schedule_versions ORDER BY 1")]
        took = []
        for _ in range(3):
            start = time.perf_counter()
            conn.execute(RUNTIMES, {"names": names, "last": 100}).fetchall()
            took.append(time.perf_counter() - start)
        print(f"\nattempts_runtimes alone (the statement status, web and the metrics run): "
              f"median {statistics.median(took):.3f}s, best {min(took):.3f}s over 3 | {load()}")
        start = time.perf_counter()
        conn.execute("CREATE INDEX attempts_timed_out_again ON attempts (finished_at) "
                     "WHERE outcome = 'timeout'")
        print(f"building migration 0009's index over {len(names)} schedules' attempts: "
              f"{time.perf_counter() - start:.3f}s")
        conn.rollback()
        print("\nEXPLAIN ANALYZE attempts_runtimes (every schedule):")
        for (line,) in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + RUNTIMES,
                                    {"names": names, "last": 100}):
            print("   ", line)


def process_cpu(pid: int) -> float:
    """User and system CPU seconds a running process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """User and system CPU seconds of the finished children (the status processes) so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def import_floor() -> None:
    """CPU of a process that only imports what the status command imports (and one importing
    SQLAlchemy alone): the part of status's CPU no change to the reads or the document touches."""
    command = ("import cronkeeper.cli.main, cronkeeper.cli.status, cronkeeper.cli.connect, "
               "cronkeeper.operations.status, cronkeeper.operations.figures, orjson")
    for what, code in (("nothing (the interpreter's start)", "pass"),
                       ("the status command's modules", command),
                       ("SQLAlchemy alone", "import sqlalchemy"), ("psycopg alone", "import psycopg")):
        cpu = []
        for _ in range(3):
            used = children_cpu()
            subprocess.run([sys.executable, "-c", code], check=True)
            cpu.append(children_cpu() - used)
        print(f"python importing {what}: CPU best {min(cpu):.3f}s, median "
              f"{statistics.median(cpu):.3f}s over 3 | {load()}")


def load() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--keep", action="store_true", help="Keep the schema afterwards.")
    parser.add_argument("--schema", help="Reuse a schema kept by an earlier run (no seeding).")
    args = parser.parse_args()

    schema = args.schema or f"bench_status_{uuid.uuid4().hex[:8]}"
    if not args.schema:
        start = time.perf_counter()
        attempts = seed(args.database_url, schema, args.schedules)
        print(f"seeded {args.schedules} schedules, {attempts} attempts, in schema {schema} in "
              f"{time.perf_counter() - start:.1f}s")
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    argv = [exe, "status", "--format", "json", "--database-url", args.database_url,
            "--schema", schema]
    env = {k: v for k, v in os.environ.items() if k != "CRONKEEPER_SCHEDULES"}
    root = Path(tempfile.mkdtemp(prefix="cronkeeper-status10k-"))
    leader = Daemon(url=args.database_url, schema=schema, cluster="default",
                    schedules=schedule_files(root / "schedules", args.schedules),
                    instance_id="bench-leader", log_dir=root, leader_timeout=10,
                    stall_timeout=30)
    try:
        start = time.perf_counter()
        leader.start()
        wait_for(lambda: summarized(args.database_url, schema) >= args.schedules, 600,
                 "the leader's summary of every schedule", interval=1.0,
                 alive=leader.proc)
        print(f"a leader summarized {args.schedules} schedules {time.perf_counter() - start:.1f}s "
              f"after it started (its log: {leader.log_path})")
        leading_from, leader_cpu = time.perf_counter(), process_cpu(leader.pid)
        for fmt in ("json", "table"):
            took, cpu = [], []
            for _ in range(args.runs if fmt == "json" else 1):
                used = children_cpu()
                start = time.perf_counter()
                proc = subprocess.run([*argv[:2], "--format", fmt, *argv[4:]],
                                      capture_output=True, text=True, env=env)
                took.append(time.perf_counter() - start)
                cpu.append(children_cpu() - used)
                if proc.returncode != 0:
                    raise SystemExit(f"status failed ({proc.returncode}): {proc.stderr[-2000:]}")
                print(f"  {fmt} run {len(took)}: {took[-1]:.3f}s, its own CPU {cpu[-1]:.3f}s "
                      f"({len(proc.stdout) / 1e6:.1f} MB) | {load()}")
            flagged = proc.stdout.count("runtime near timeout")
            print(f"cronkeeper status --format {fmt}, {args.schedules} schedules: median "
                  f"{statistics.median(took):.3f}s, best {min(took):.3f}s over {len(took)} "
                  f"run(s) (its CPU: best {min(cpu):.3f}s; {flagged} schedules diagnosed near "
                  "their timeout)")
        in_process(args.database_url, schema)
        import_floor()
        lasted = time.perf_counter() - leading_from
        print(f"the leader (ticking and summarizing, no workers) meanwhile: "
              f"{process_cpu(leader.pid) - leader_cpu:.1f}s of CPU in {lasted:.0f}s")
        leader.stop(60)
        # the same command once the leader has stopped: every figure computed live, as before
        # the summary (the ratio within this run)
        used = children_cpu()
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"status failed ({proc.returncode}): {proc.stderr[-2000:]}")
        print(f"cronkeeper status --format json without a leader (all computed live): "
              f"{time.perf_counter() - start:.3f}s, its own CPU {children_cpu() - used:.3f}s "
              f"| {load()}")
        explain(args.database_url, schema)
    finally:
        if leader.alive():
            leader.kill()
        if not args.keep and not args.schema:
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()
