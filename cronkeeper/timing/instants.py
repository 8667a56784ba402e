"""Instants given on the command line: ISO 8601 with an offset or ``Z``, nothing else."""

from __future__ import annotations

from datetime import UTC, datetime

from cronkeeper.timing.errors import TimingError

MIN_YEAR, MAX_YEAR = 1970, 9998


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
    if utc is None or not MIN_YEAR <= utc.year <= MAX_YEAR:
        raise TimingError(f"{text!r} is out of range: give an instant between {MIN_YEAR} and {MAX_YEAR}")
    return utc
