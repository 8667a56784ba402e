"""How long a leader takes to fire its first period with a large set on a busy machine (issue 21).

N six-field schedules (``--cron``, by default ``"*/5 * * * * *"``, in files of 1,000) on a
private PostgreSQL (fsync on), beside ``--busy`` processes that spin on the CPU and, with
``--dsync``, one that writes 64 MiB with ``dd ... oflag=dsync`` to the server's filesystem over
and over (a noisy neighbour on the disk: issue 21's repro). Two starts, each with
``--stall-timeout``: a first start (every version new: adoption), then, after a SIGKILL, a
takeover by a second daemon (every version read back, the missed periods caught up). For each:
seconds from the process's start to its first emitted period and to N periods emitted under
its term (a whole instant's, for schedules that fire every 5 s), and how many times the stall watchdog stepped a term down meanwhile. A start that
fires nothing within ``--limit`` seconds is reported as such (the livelock of issue 21).

    .venv/bin/python benchmarks/first_fire_under_load.py [--schedules 30000] [--busy 2]
        [--dsync] [--cron "* * * * * *"] [--stall-timeout 2] [--limit 120] [--warmup 60]

Issue 21's own run: ``--schedules 100000 --busy 4 --dsync --cron "* * * * * *"
--stall-timeout 10``. The machine's load average is printed with each start (other work on a
shared machine counts too).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from daemon_harness import (  # noqa: E402
    Daemon,
    PrivatePostgres,
    schedule_toml,
    set_path,
    write_schedules,
)
from faults import busy_loops, dsync_writer  # noqa: E402

PER_FILE = 1000


def emitted_after(pg: PrivatePostgres, schema: str, term: int) -> int:
    with set_path(pg.connect(), schema) as conn:
        return conn.execute("SELECT count(*) FROM periods WHERE outcome = 'emitted' AND term > %s",
                            (term,)).fetchone()[0]


def max_term(pg: PrivatePostgres, schema: str) -> int:
    with set_path(pg.connect(), schema) as conn:
        return conn.execute("SELECT coalesce(max(term), 0) FROM leadership").fetchone()[0]


def measure(pg: PrivatePostgres, schema: str, daemon: Daemon, n: int, limit: float) -> str:
    after = max_term(pg, schema)
    start = time.monotonic()
    daemon.start()
    first = whole = None
    while time.monotonic() - start < limit and whole is None:
        count = emitted_after(pg, schema, after)
        now = time.monotonic() - start
        if count and first is None:
            first = now
        if count >= n:
            whole = now
        time.sleep(0.1)
    stalls = sum(1 for r in daemon.records() if r.get("action") == "leader_stalled")
    terms = max_term(pg, schema) - after

    def shown(t: float | None) -> str:
        return f"{t:.1f} s" if t is not None else f"none in {limit:.0f} s"

    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"first fire {shown(first)}, {n} periods emitted {shown(whole)}; "
            f"{stalls} stalls, {terms} terms; load average {load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=30_000)
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the leader")
    parser.add_argument("--dsync", action="store_true",
                        help="a dd writer fsyncing every block to the server's filesystem")
    parser.add_argument("--cron", default="*/5 * * * * *", help="every schedule's six-field cron")
    parser.add_argument("--stall-timeout", type=float, default=2.0)
    parser.add_argument("--limit", type=float, default=120.0)
    parser.add_argument("--warmup", type=float, default=0.0,
                        help="seconds the neighbours run before the first start (so the load "
                             "average printed shows them)")
    args = parser.parse_args()
    n = args.schedules
    with tempfile.TemporaryDirectory(prefix="first-fire-") as tmp:
        directory = write_schedules(Path(tmp) / "s", {
            f"f{f:03d}.toml": "\n".join(
                schedule_toml(f"s{f:03d}-{i:04d}", cron=args.cron, misfire="skip")
                for i in range(PER_FILE))
            for f in range(n // PER_FILE)})
        pg = PrivatePostgres(fsync=True)
        pg.start()
        daemons: list[Daemon] = []
        print(f"load average before: {', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
        with contextlib.ExitStack() as neighbours:
            neighbours.callback(pg.stop)
            schema = pg.new_schema()
            neighbours.enter_context(busy_loops(args.busy))
            if args.dsync:  # beside the server's files: the same disk
                neighbours.enter_context(dsync_writer(pg.root))
            time.sleep(args.warmup)
            print(f"load average after {args.warmup:g} s of neighbours: "
                  f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
            for name in ("first-start", "takeover"):
                daemon = Daemon(url=pg.url, schema=schema, cluster="bench", schedules=directory,
                                instance_id=name, log_dir=Path(tmp),
                                stall_timeout=args.stall_timeout, leader_timeout=30)
                daemons.append(daemon)
                neighbours.callback(daemon.kill)
                print(f"{name}: {measure(pg, schema, daemon, n, args.limit)}", flush=True)
                daemon.kill()
    print(f"{n} schedules ({args.cron}), {args.busy} busy loops"
          f"{', a dd writer with oflag=dsync' if args.dsync else ''}, --stall-timeout "
          f"{args.stall_timeout:g}; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
