"""Retry delays and per-period jitter: pure functions of their inputs (no clock, no randomness
of their own; the caller passes the random value).

- ``retry_delay``: exponential backoff with *full jitter* (AWS architecture blog's name): the
  delay before retry ``attempt`` is uniform in ``[0, min(max, base * factor ** (attempt - 1))]``,
  so a downstream outage does not produce a synchronized retry wave.
- ``period_jitter``: the delay of one period's job, deterministic from the SHA-256 of its
  idempotency key, so two leaders (or a replayed plan) compute the same ``run_after``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

# A job's backoff when its schedule (or ``enqueue``) sets none: the defaults docs/schedules.md states.
DEFAULT_BASE = 30.0
DEFAULT_FACTOR = 2.0
DEFAULT_MAX = 3600.0


def backoff_ceiling(attempt: int, base: float, factor: float, maximum: float) -> float:
    """The upper bound of the delay after failed attempt ``attempt`` (counted from 1)."""
    if attempt < 1:
        attempt = 1
    try:
        ceiling = base * factor ** (attempt - 1)
    except OverflowError:
        ceiling = maximum
    return max(0.0, min(maximum, ceiling))


def retry_delay(attempt: int, base: float, factor: float, maximum: float, rand: float) -> float:
    """Seconds to wait before the next attempt after failed attempt ``attempt`` (from 1).

    ``rand`` is a uniform random value in [0, 1): full jitter scales the whole ceiling by it.
    """
    rand = min(max(rand, 0.0), 1.0)
    return backoff_ceiling(attempt, base, factor, maximum) * rand


def job_retry_delay(attempt: int, backoff: Mapping[str, float], rand: float) -> float:
    """``retry_delay`` with a job's stored backoff (``{"base", "factor", "max"}``), each key
    missing taking its default."""
    return retry_delay(attempt, float(backoff.get("base", DEFAULT_BASE)),
                       float(backoff.get("factor", DEFAULT_FACTOR)),
                       float(backoff.get("max", DEFAULT_MAX)), rand)


def period_jitter(key: str, jitter_seconds: float) -> float:
    """A delay in [0, jitter_seconds), the same for the same key on every instance."""
    if jitter_seconds <= 0:
        return 0.0
    fraction = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return fraction * jitter_seconds
