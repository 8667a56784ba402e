"""Instants as text and as whole Unix seconds, fast: the audit (``cronkeeper.audit``) turns
a year of periods into half a million rows of ISO 8601 text. Pure."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta


def unix(when: datetime) -> int:
    """Whole Unix seconds (floor)."""
    return math.floor(when.timestamp())


_DAY_PREFIX: dict[int, str] = {}
_TIME_OF_DAY: list[str] = []  # "HH:MM:SS" of each second of a day, built on first use


def iso_second(at: int) -> str:
    """ISO 8601 UTC text of whole Unix seconds: ``2026-03-08T07:00:00Z`` (lookup tables: half
    a million of these must take well under a second)."""
    day, second = divmod(at, 86400)
    if not _TIME_OF_DAY:
        _TIME_OF_DAY.extend(f"{h:02d}:{m:02d}:{s:02d}" for h in range(24) for m in range(60)
                            for s in range(60))
    prefix = _DAY_PREFIX.get(day)
    if prefix is None:
        prefix = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(days=day)).strftime("%Y-%m-%dT")
        _DAY_PREFIX[day] = prefix
    return f"{prefix}{_TIME_OF_DAY[second]}Z"


def iso_unix(seconds: float) -> str:
    """ISO 8601 UTC text of Unix seconds, with milliseconds when there is a fraction."""
    whole = math.floor(seconds)
    millis = round((seconds - whole) * 1000)
    if millis == 0 or millis == 1000:
        return iso_second(whole + millis // 1000)
    return f"{iso_second(whole)[:-1]}.{millis:03d}Z"


def iso(when: datetime) -> str:
    return iso_unix(when.timestamp())
