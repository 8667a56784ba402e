"""Run time against timeout, per schedule (docs/observability.md, "Timeouts matched to the work"): the figures
``status``, ``web``, ``explain`` and the metrics show, and when they say it is too close (pure).

The seeds: "set the lease above the p99 runtime" and "a timeout slightly above p99". A schedule
is *near its timeout* when the p99 run time of its last ``SAMPLE`` finished attempts exceeds
``NEAR`` of its timeout, or when an attempt timed out in the last 24 hours. A timed-out attempt
counts at its timeout (it would have run longer: its real run time is unknown).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SAMPLE = 100  # finished attempts per schedule the percentiles are taken over
NEAR = 0.8  # p99 above this fraction of the timeout: near
HEADROOM = 1.25  # a suggested timeout: this much above the p99 ("slightly above p99")


@dataclass(frozen=True, slots=True)
class Runtime:
    """One schedule's figures. ``p50``/``p99`` are None when no attempt has finished."""

    schedule: str
    timeout: float
    attempts: int = 0  # finished attempts the percentiles are taken over (at most SAMPLE)
    p50: float | None = None
    p99: float | None = None
    timed_out_24h: int = 0

    @property
    def share(self) -> float | None:
        """p99 as a fraction of the timeout."""
        if self.p99 is None or self.timeout <= 0:
            return None
        return self.p99 / self.timeout

    @property
    def near(self) -> bool:
        share = self.share
        return self.timed_out_24h > 0 or (share is not None and share > NEAR)

    def suggested_timeout(self) -> float | None:
        """A timeout slightly above the p99 (``HEADROOM``), in whole seconds; when attempts
        timed out the p99 is at the timeout and the real run time is unknown, so at least
        ``HEADROOM`` times the timeout."""
        if self.p99 is None:
            return None
        base = max(self.p99, self.timeout) if self.timed_out_24h else self.p99
        return float(math.ceil(base * HEADROOM))


def runtime_of(schedule: str, timeout: float,
               found: tuple[int, float | None, float | None, int] | None) -> Runtime:
    """A schedule's figures from ``db.attempts.attempts_runtimes``'s tuple (None: no attempt
    recorded)."""
    if found is None:
        return Runtime(schedule, timeout)
    n, p50, p99, timed_out = found
    return Runtime(schedule, timeout, n, p50, p99, timed_out)


def json_fields(runtime: Runtime) -> dict[str, Any]:
    """The fields of a ``status`` JSON ``schedules`` item (docs/observability.md), also on the web's pages
    and in ``explain``."""
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return {
        "duration_p50_seconds": rounded(runtime.p50),
        "duration_p99_seconds": rounded(runtime.p99),
        "duration_attempts": runtime.attempts,
        "timeout_seconds": runtime.timeout,
        "attempts_timed_out_24h": runtime.timed_out_24h,
        "near_timeout": runtime.near,
    }


def seconds(value: float | None) -> str:
    """A duration as the diagnosis and the pages write it: 0.93s, 42s, 12m 30s, 2h 5m."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}s"
    if value < 120:
        return f"{value:.0f}s"
    whole = round(value)
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes}m {rest}s" if rest else f"{minutes}m"
    hours, rest = divmod(whole, 3600)
    return f"{hours}h {rest // 60}m" if rest // 60 else f"{hours}h"


def figures(runtime: Runtime) -> str:
    """The figures in words: p50, p99 of N attempts, the timeout, the 24 h timeouts."""
    share = runtime.share
    pct = f" ({share:.0%} of its timeout)" if share is not None else ""
    text = (f"p99 run time {seconds(runtime.p99)}{pct}, p50 {seconds(runtime.p50)} over its last "
            f"{runtime.attempts} finished attempt{'s' if runtime.attempts != 1 else ''}, "
            f"timeout {seconds(runtime.timeout)}")
    if runtime.timed_out_24h:
        n = runtime.timed_out_24h
        text += f"; {n} attempt{'s' if n != 1 else ''} timed out in the last 24 h"
    return text


def advice(runtime: Runtime, where: str | None) -> str:
    """What to change: ``timeout`` at ``where`` (``file:line``, or words saying where to look),
    or a split into shorter jobs."""
    suggested = runtime.suggested_timeout()
    to = f" to {seconds(suggested)} or more" if suggested is not None else ""
    place = f" ({where})" if where else ""
    killed = (" (a killed attempt is retried from the start, and its side effects may have "
              "happened twice)" if runtime.timed_out_24h else "")
    return (f"raise `timeout`{to}{place}, slightly above the real p99 run time, or split the "
            f"job into shorter ones that each fit{killed}")
