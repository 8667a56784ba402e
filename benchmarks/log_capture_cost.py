"""What keeping a handler's log records costs the worker, in one process and without the
database: the part of benchmarks/output_capture.py's "handler logging 10 lines" that is the
worker's own Python, measured apart from the noise of a shared machine.

    .venv/bin/python benchmarks/log_capture_cost.py [--repeat 30] [--jobs 2000]
    .venv/bin/python benchmarks/log_capture_cost.py --instructions [--jobs 2000]

A "job" is what the worker does around the benchmark's handler in this process: a ``Running``
job (``keep_records`` with the default 64 KiB limit when kept), the handler's 10 ``log.info``
calls with two arguments (about 105 bytes a line as kept) inside ``capturing``, then
``output()`` as the worker takes it at the job's end; on a root logger prepared as the worker
prepares it (``logcapture.install``). Four variants:

- ``dropped``: nothing kept (``output_limit = "0B"``): the records are made and dropped at the
  root, the comparison arm of output_capture.py;
- ``kept``: the records kept, as the worker keeps them;
- ``floor``: the worker's handler replaced on the root by one as bare as a handler can be
  (``handle`` overridden: no lock, no filter, no context variable), which formats each record's
  line with a stamp made once (``f"{stamp} {levelname} {name}: {msg % args}\n"``) into a list
  that the job joins and encodes at its end: the least that keeping the lines costs in Python
  whatever the code around it (no traceback, no cap, no other job's records told apart), so
  that ``kept`` can be read against it;
- ``unmade``: a worker that keeps no output at all (``--output-limit 0B`` and every task
  schedule ``"0B"``), which leaves an untouched root logger at WARNING: the 10 ``log.info``
  calls return before a record is made, as they did before output was kept.

By default each is timed with the thread's CPU clock, the best of ``--repeat`` rounds of
``--jobs`` jobs, in alternation. With ``--instructions`` the script runs itself under
``valgrind --tool=callgrind`` (Debian's valgrind) once per variant with ``--jobs`` jobs and
once with none, and prints the instructions per job: the same count on every run, whatever
else the machine is doing (records are stamped with one fixed instant there, as they would be
by the hundreds within a millisecond at full speed, so that valgrind's slowness does not make
every record a new millisecond; and with ``PYTHONHASHSEED=0``: a random seed lays out the
process's dicts differently at each run, which moved the counts by up to 0.5 %).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
import time
import types

from cronkeeper.output import DEFAULT_LIMIT
from cronkeeper.worker import logcapture
from cronkeeper.worker.runtime import Running

VARIANTS = ("dropped", "kept", "floor", "unmade")
STAMP = "2026-03-08T07:00:01.250Z"


class Bare(logging.Handler):
    """The floor: each record's line formatted into ``lines``, nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] | None = None

    def handle(self, record: logging.LogRecord) -> bool:
        lines = self.lines
        if lines is not None:
            lines.append(f"{STAMP} {record.levelname} {record.name}: {record.msg % record.args}\n")
        return True


BARE = Bare()


def handler(log: logging.Logger) -> None:
    """The job's handler (output_capture.py's), one function for every variant: a record's line
    number is found by reading its function's line table up to the call (``f_lineno``), so a
    call further into a longer function costs more (some 1,900 instructions a record)."""
    for i in range(10):
        log.info("bench line %d of job %s: something worth keeping", i, "log@12345")


def run_jobs(log: logging.Logger, jobs: int, variant: str) -> None:
    keep, floor, unmade = variant == "kept", variant == "floor", variant == "unmade"
    root, installed = logging.getLogger(), logcapture.install()
    level = root.level
    if floor:  # the bare handler in the worker's handler's place, for the floor's rounds only
        root.removeHandler(installed)
        root.addHandler(BARE)
    if unmade:  # the root as a worker keeping nothing leaves it
        root.removeHandler(installed)
        root.setLevel(logging.WARNING)
    try:
        for _ in range(jobs):
            held = Running(job=None)  # type: ignore[arg-type] - no job is read
            if keep:
                held.keep_records(DEFAULT_LIMIT)
            if floor:
                BARE.lines = []
            with logcapture.capturing(held if keep else None):
                handler(log)
            held.output()
            if floor:
                "".join(BARE.lines).encode("utf-8", "replace")  # type: ignore[arg-type]
                BARE.lines = None
    finally:
        if floor:
            root.removeHandler(BARE)
        if floor or unmade:
            root.addHandler(installed)
            root.setLevel(level)


def timed(args: argparse.Namespace, log: logging.Logger) -> None:
    best = {name: float("inf") for name in VARIANTS}
    for _ in range(args.repeat):
        for name in VARIANTS:
            start = time.thread_time()
            run_jobs(log, args.jobs, name)
            best[name] = min(best[name], (time.thread_time() - start) / args.jobs)
    base = best["dropped"]
    for name, seconds in best.items():
        print(f"{name:8s} {seconds * 1e6:6.2f} us per job ({(seconds - base) * 1e6:+6.2f})")
    print(f"kept / dropped: {best['kept'] / base:.3f} of the worker's Python for these 10 records;"
          f" floor / dropped: {best['floor'] / base:.3f}; unmade / dropped: "
          f"{best['unmade'] / base:.3f}")


def instructions(jobs: int) -> None:
    def count(variant: str, n: int) -> int:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
             __file__, "--under-callgrind", variant, "--jobs", str(n)],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        return int(re.search(r"Collected : (\d+)", done.stderr).group(1))  # type: ignore[union-attr]

    start = count("dropped", 0)  # start-up and imports, the same for both
    per_job = {v: (count(v, jobs) - start) / jobs for v in VARIANTS}
    for name, n in per_job.items():
        print(f"{name:8s} {n:9.0f} instructions per job ({n - per_job['dropped']:+8.0f})")
    print(f"kept / dropped: {per_job['kept'] / per_job['dropped']:.3f} of the instructions;"
          f" floor / dropped: {per_job['floor'] / per_job['dropped']:.3f}; unmade / dropped: "
          f"{per_job['unmade'] / per_job['dropped']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under valgrind's callgrind instead")
    parser.add_argument("--under-callgrind", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.instructions:
        instructions(args.jobs)
        return
    logcapture.install()
    log = logging.getLogger("bench.output")
    if args.under_callgrind:
        fixed = 1772953201.25
        logging.time = types.SimpleNamespace(  # type: ignore[attr-defined]
            time=lambda: fixed, time_ns=lambda: int(fixed * 1e9))
        run_jobs(log, args.jobs, args.under_callgrind)
        return
    timed(args, log)


if __name__ == "__main__":
    main()
