"""The one place that reads the machine's clocks. Everything else takes time as an input.

The daemon plans with the database's clock (see ``db.clock_now``); this module only gives the
local wall clock (to measure skew and to log) and the monotonic clock (to sleep and time out).
"""

import time
from datetime import UTC, datetime


def wall() -> datetime:
    return datetime.now(UTC)


def monotonic() -> float:
    return time.monotonic()


def sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)
