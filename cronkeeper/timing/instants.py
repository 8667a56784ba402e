"""Instants given on the command line: ISO 8601 with an offset or ``Z``, nothing else."""

from __future__ import annotations

from datetime import UTC, datetime

from cronkeeper.timing import zones
from cronkeeper.timing.errors import TimingError

# The range fires are computed in (triggers.LIMIT ends it): an instant cronkeeper accepts is one
# it can answer for, so `next --after` never meets a year it cannot compute.
FIRST = datetime(1970, 1, 1, tzinfo=UTC)
END = datetime(zones.MAX_YEAR, 1, 1, tzinfo=UTC)  # exclusive
MIN_YEAR, MAX_YEAR = FIRST.year, END.year - 1


def parse_instant(text: str) -> datetime:
    """An aware UTC datetime, or TimingError saying what is wrong. A naive time is refused:
    it would be ambiguous (which zone? and in a fold, which occurrence?)."""
    raw = text.strip() if isinstance(text, str) else ""
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise TimingError(
            f"{text!r} is not an ISO 8601 instant; write e.g. 2026-03-08T07:00:00Z"
        ) from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise TimingError(f"{text!r} has no offset; add Z or an offset such as -04:00")
    try:
        utc = when.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not FIRST <= utc < END:
        raise TimingError(
            f"{text!r} is out of range: give an instant from {FIRST:%Y-%m-%d} up to, not "
            f"including, {END:%Y-%m-%dT%H:%M:%SZ} (the range cronkeeper computes fires in)"
        )
    return utc
