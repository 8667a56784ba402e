"""Imported at start-up (through ``PYTHONPATH``) only by the processes tests/test_clock_skew.py
runs under libfaketime; nothing else puts this folder on the path.

libfaketime 0.9.10 (Debian 12's) breaks ``time.sleep`` on Python 3.11 when it leaves the
monotonic clock alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``, as a real VM's clock step does):
Python 3.11 sleeps with ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...)``, and that
release rewrites the absolute monotonic deadline as if it were a faked wall-clock one, so the
kernel gets an invalid request and the sleep fails with EINVAL (libfaketime issue #426, fixed
after 0.9.10). Where that happens, ``time.sleep`` waits the same relative time on a lock's
timed acquire instead, which glibc hands to the kernel on the real monotonic clock. Where the
installed libfaketime sleeps correctly, nothing is changed.
"""

from __future__ import annotations

import threading
import time


def _sleep_on_a_lock(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    lock = threading.Lock()
    lock.acquire()
    remaining = seconds
    deadline = time.monotonic() + seconds
    while remaining > 0:
        lock.acquire(timeout=min(remaining, threading.TIMEOUT_MAX))
        remaining = deadline - time.monotonic()


try:
    time.sleep(0.0001)
except OSError:
    time.sleep = _sleep_on_a_lock
