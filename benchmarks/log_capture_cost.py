"""What keeping a handler's log records costs the worker, in one process and without the
database: the part of benchmarks/output_capture.py's "handler logging 10 lines" that is the
worker's own Python, measured apart from the noise of a shared machine.

    .venv/bin/python benchmarks/log_capture_cost.py [--repeat 30] [--jobs 2000]

A "job" is what the benchmark's handler does (10 ``log.info`` calls with two arguments, about
105 bytes a line as kept) inside ``capturing``, on a root logger prepared as the worker prepares
it (``logcapture.install``). Variants, each timed with the thread's CPU clock, the best of
``--repeat`` rounds of ``--jobs`` jobs, in alternation:

- ``dropped``: no capture (``output_limit = "0B"``): the records are made and dropped, the
  comparison arm of output_capture.py;
- ``getMessage only``: the records of a capture only have their message formatted (what
  ``logging`` does for any record that goes anywhere): the part of keeping them that no
  capture can avoid;
- ``kept``: the capture as the worker runs it, closed at the end as the recorder does.

Printed: microseconds per job for each, and what each costs beyond ``dropped``.
"""

from __future__ import annotations

import argparse
import logging
import time

from cronkeeper.output import DEFAULT_LIMIT, Capture
from cronkeeper.worker import logcapture


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    handler = logcapture.install()
    log = logging.getLogger("bench.output")
    current = logcapture._current

    def message_only(record: logging.LogRecord) -> bool:
        if current.get() is not None:
            record.getMessage()
        return True

    def job(key: str, capture: Capture | None) -> None:
        with logcapture.capturing(capture):
            for i in range(10):
                log.info("bench line %d of job %s: something worth keeping", i, key)
        if capture is not None:
            capture.close()

    variants = {"dropped": (False, handler.handle), "getMessage only": (True, message_only),
                "kept": (True, handler.handle)}
    best = {name: float("inf") for name in variants}
    for _ in range(args.repeat):
        for name, (keep, handle) in variants.items():
            handler.handle = handle  # type: ignore[method-assign]
            start = time.thread_time()
            for _ in range(args.jobs):
                job("log-capture@12345", Capture(DEFAULT_LIMIT) if keep else None)
            best[name] = min(best[name], (time.thread_time() - start) / args.jobs)
    del handler.handle  # back to the class's
    base = best["dropped"]
    for name, seconds in best.items():
        print(f"{name:16s} {seconds * 1e6:6.2f} us per job (+{(seconds - base) * 1e6:5.2f})")
    print(f"kept / dropped: {best['kept'] / base:.3f} of the worker's Python for these 10 records")


if __name__ == "__main__":
    main()
