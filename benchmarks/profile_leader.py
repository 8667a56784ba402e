"""Where the leader's time and memory go: its phases in one process, profiled one at a time.

The same schedules as ``burst_vs_apscheduler.py`` (N six-field crons, all due at the same
instants), against a private PostgreSQL (fsync on). Phases, each timed (and with ``--profile``,
under cProfile, top functions by cumulative and own time):

1. load: ``load_valid`` of the schedule files (what ``cronkeeper run`` does before READY=1);
2. lead: win the lock, ``load_versions``, ``tick_until_current``, ``adopt`` (every version row);
3. burst: wait for the next instant all N fall due at, then ``tick`` until it is decided.

With ``--floor``, the COPY text the leader sent during the burst is kept and then replayed,
tick by tick (one transaction each, as sent), into fresh schemas on the same server, with no
leader work at all: what the server alone needs for the burst (CPU and wall, the commits'
share), as the schema is and with each secondary index dropped in turn, then all of them
(``--floor-runs`` rounds). It answers "how far can the leader's side still go" and "what does
each index cost". (The replay sends no heartbeat, id or NOTIFY statement, only the COPYs; the
kept text, about 25 MB at 100,000, counts in the burst's peak RSS printed.)

With ``--memory``, tracemalloc runs from before the load to after the burst (much slower, so
times are not comparable then) and prints the bytes held per schedule after each phase, with
the allocating lines that hold the most.

    .venv/bin/python benchmarks/profile_leader.py [--schedules 100000] [--profile] [--memory]
        [--floor [--floor-runs 2]]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import resource
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from burst_vs_apscheduler import EVERY, cpu_seconds, write_files  # noqa: E402
from daemon_harness import PrivatePostgres  # noqa: E402

from cronkeeper import clock  # noqa: E402
from cronkeeper.db import leadership as dbl  # noqa: E402
from cronkeeper.db.engine import leader_lock_key, normalize_url  # noqa: E402
from cronkeeper.db.sessions import backend_pid_now, db_now  # noqa: E402
from cronkeeper.schedule import load_valid  # noqa: E402
from cronkeeper.scheduler import Scheduler  # noqa: E402
from cronkeeper.term import Term  # noqa: E402


class Phase:
    def __init__(self, name: str, profile: bool, n: int) -> None:
        self.name, self.n = name, n
        # CPU time, not wall time: on a shared, loaded box wall time lands wherever the
        # process happened to be descheduled
        self.profiler = cProfile.Profile(time.process_time) if profile else None

    def __enter__(self) -> Phase:
        self.start = time.perf_counter()
        self.cpu = time.process_time()
        if self.profiler:
            self.profiler.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.profiler:
            self.profiler.disable()
        elapsed = time.perf_counter() - self.start
        cpu = time.process_time() - self.cpu
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"[{self.name}] {elapsed:.2f} s wall, {cpu:.2f} s CPU in this process; peak RSS "
              f"so far {rss:.0f} MiB; load average {os.getloadavg()[0]:.1f}", flush=True)
        if tracemalloc.is_tracing():
            current, peak = tracemalloc.get_traced_memory()
            print(f"[{self.name}] traced: {current / 2**20:.1f} MiB held "
                  f"({current / self.n:.0f} B per schedule), peak {peak / 2**20:.1f} MiB")
            top = tracemalloc.take_snapshot().statistics("lineno")[:12]
            for stat in top:
                frame = stat.traceback[0]
                print(f"    {stat.size / 2**20:7.1f} MiB {stat.count:9d} blocks  "
                      f"{frame.filename.split('cronkeeper/')[-1]}:{frame.lineno}")
        if self.profiler:
            for key in ("cumulative", "tottime"):
                out = io.StringIO()
                pstats.Stats(self.profiler, stream=out).sort_stats(key).print_stats(14)
                lines = out.getvalue().splitlines()
                start = next(i for i, line in enumerate(lines) if "ncalls" in line)
                print(f"  by {key}:")
                print("\n".join("  " + line for line in lines[start:start + 15] if line.strip()))


# The burst's secondary indexes (every index but the primary keys), and how to drop each.
SECONDARY = {
    "periods_decided_at": "DROP INDEX periods_decided_at",
    "outbox_idempotency_key": "ALTER TABLE outbox DROP CONSTRAINT outbox_idempotency_key_key",
    "outbox_available": "DROP INDEX outbox_available",
    "outbox_unfinished_by_schedule": "DROP INDEX outbox_unfinished_by_schedule",
    "outbox_schedule_period": "DROP INDEX outbox_schedule_period",
}


@contextmanager
def copies_kept(kept: list[tuple[str, list[bytes | str]]]) -> Iterator[None]:
    """Every COPY run through psycopg meanwhile, with the data written to it, appended to
    ``kept`` as (statement, chunks): the exact text the leader sent."""
    original = psycopg.Cursor.copy

    @contextmanager
    def tee(cursor: psycopg.Cursor, statement: str, *args: object, **kwargs: object):
        chunks: list[bytes | str] = []
        with original(cursor, statement, *args, **kwargs) as copy:
            write = copy.write

            def write_kept(data: bytes | str) -> None:
                chunks.append(data)
                write(data)

            copy.write = write_kept  # type: ignore[method-assign]
            yield copy
        kept.append((statement, chunks))

    psycopg.Cursor.copy = tee  # type: ignore[assignment]
    try:
        yield
    finally:
        psycopg.Cursor.copy = original  # type: ignore[method-assign]


def replay(pg: PrivatePostgres, ticks: list[list[tuple[str, list[bytes | str]]]],
           drop: list[str]) -> tuple[float, float, float]:
    """The ticks' COPYs replayed into a fresh schema (less the indexes ``drop`` names), one
    transaction per tick: (wall s, server backend CPU s, wall s spent in the commits)."""
    conn = dbl.lock_connect(normalize_url(pg.url), pg.new_schema(), "cronkeeper-floor")
    try:
        for statement in drop:
            conn.execute(statement)
        backend = backend_pid_now(conn)
        cpu = cpu_seconds(backend)
        commits = 0.0
        start = time.perf_counter()
        for tick in ticks:
            conn.execute("BEGIN")
            with conn.cursor() as cur:
                for statement, chunks in tick:
                    with cur.copy(statement) as copy:
                        for chunk in chunks:
                            copy.write(chunk)
            before = time.perf_counter()
            conn.execute("COMMIT")
            commits += time.perf_counter() - before
        return time.perf_counter() - start, cpu_seconds(backend) - cpu, commits
    finally:
        conn.close()


def floor(pg: PrivatePostgres, ticks: list[list[tuple[str, list[bytes | str]]]],
          runs: int) -> None:
    variants = {"the schema as it is": [], **{f"without {name}": [statement] for name, statement
                                              in SECONDARY.items()},
                "without all five": list(SECONDARY.values())}
    print(f"[floor] the burst's own COPY text ({len(ticks)} ticks) replayed with no leader "
          "work, one transaction per tick:")
    for _ in range(runs):
        for name, drop in variants.items():
            wall, cpu, commits = replay(pg, ticks, drop)
            print(f"[floor] {name:40} {wall:5.2f} s wall, server CPU {cpu:5.2f} s, "
                  f"commits {commits:5.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--per-file", type=int, default=1000)
    parser.add_argument("--form", choices=["cron6", "every"], default="cron6")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--floor", action="store_true")
    parser.add_argument("--floor-runs", type=int, default=2)
    args = parser.parse_args()
    n = args.schedules

    pg = PrivatePostgres(fsync=True, settings={"track_commit_timestamp": "on"}).start()
    root = Path(tempfile.mkdtemp(prefix="cronkeeper-profile-"))
    try:
        schema = pg.new_schema()
        write_files(root / "schedules", n, args.per_file, args.form)
        if args.memory:
            tracemalloc.start()
        with Phase("load", args.profile, n):
            schedules = load_valid([str(root / "schedules")], now=clock.wall())
        url = normalize_url(pg.url)
        key = leader_lock_key(schema, "profile")
        conn = dbl.lock_connect(url, schema, "cronkeeper-lock:profile")
        assert dbl.lock_wait(conn, key)
        term, _ = dbl.leadership_claim(conn, "profile", "profile")
        scheduler = Scheduler(Term(conn, term, "profile", key))
        with Phase("lead", args.profile, n):
            scheduler.load_versions()
            scheduler.tick_until_current()
            scheduler.adopt(schedules)
            gc.collect()  # as leading.LeaderLoop does after adopting a set
            gc.freeze()
        due = scheduler.next_due()
        assert due is not None
        wait = (due - db_now(conn)).total_seconds()
        print(f"burst at {due.isoformat()}, {wait:.1f} s from now", flush=True)
        while db_now(conn) < due:
            time.sleep(0.05)
        decided = 0
        backend = backend_pid_now(conn)
        server_cpu = cpu_seconds(backend)
        kept: list[tuple[str, list[bytes | str]]] = []
        ticks: list[list[tuple[str, list[bytes | str]]]] = []
        with Phase("burst", args.profile, n), copies_kept(kept) if args.floor else nullcontext():
            while decided < n:
                decided += len(scheduler.tick().decisions)
                ticks.append(kept[:])
                kept.clear()
        server_cpu = cpu_seconds(backend) - server_cpu
        print(f"[burst] {server_cpu:.2f} s CPU in the server backend that ran the statements")
        lags = conn.execute(
            "SELECT extract(epoch FROM min(pg_xact_commit_timestamp(xmin)) - %(d)s),"
            " extract(epoch FROM max(pg_xact_commit_timestamp(xmin)) - %(d)s) FROM outbox"
            " WHERE scheduled_for = %(d)s", {"d": due}).fetchone()
        print(f"burst: {decided} periods decided (every {EVERY} s); commit lag first "
              f"{float(lags[0]) * 1000:.0f} ms, last {float(lags[1]) * 1000:.0f} ms")
        conn.close()
        if args.floor:
            floor(pg, [tick for tick in ticks if tick], args.floor_runs)
    finally:
        pg.stop()



if __name__ == "__main__":
    main()
