"""How a reader judges the leader's summary rows (``db.schedule_summaries``, written by
``cronkeeper.summarizer``), and the rules both sides share. Pure.

A row is used only while a leader leads, when it is at most ``STALE_AFTER`` seconds old and was
computed under the version still in force (``usable``); its next fire only through
``next_fire_after`` and its period around an instant only through ``period_around``, both
exact: the row lists every fire after the decided period it was computed after, up to its last
one; its missing count through ``missing_at``, which leaves out the periods that have left the
hour since the row's time.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

EVERY = 30.0  # seconds from the start of one pass of the summarizer to the next
STALE_AFTER = 180.0  # readers compute a schedule live when its row is older than this
AUDIT_WINDOW = timedelta(hours=1)  # the missing count status and the metrics show
# a row lists every next fire up to this past its time, and the two after (so the period
# around any instant a reader may use it at is in the list too), at most FIRES_MAX of them
FIRES_AHEAD = timedelta(seconds=STALE_AFTER + 2 * EVERY)
FIRES_MAX = 64  # an every-second schedule's list stops early: its readers compute the rest
MISSING_KEPT = 64  # a row keeps the earliest of its missing periods, to count them at any now


def next_after(active_from: datetime, latest: datetime | None) -> datetime:
    """The instant a schedule's next undecided fire follows: its latest decided period, or
    the start of its version in force when that is later (or nothing was decided)."""
    return active_from if latest is None else max(active_from, latest)


def usable(rows: Mapping[str, Any], current: Mapping[str, int]) -> dict[str, Any]:
    """The rows a reader may use, of ``current`` (schedule in force -> its version id); the
    leader's liveness is the caller's to judge."""
    return {n: r for n, r in rows.items()
            if current.get(n) == r.version_id and r.age_seconds <= STALE_AFTER}


def next_fire_after(row: Any, after: datetime) -> tuple[bool, datetime | None]:
    """The schedule's first fire after ``after`` (its latest decided period, or the start of its
    version in force) as the row implies it: (True, fire or None when it fires no more), or
    (False, None) when the row cannot say (``after`` before the row's own, or past its list)."""
    fires = row.next_fires
    if after < row.decided_through:
        return False, None
    if not fires:
        return True, None  # no fire after decided_through: none after a later instant either
    if after >= fires[-1]:
        return False, None
    return True, next(f for f in fires if f > after)


def period_around(row: Any, now: datetime) -> tuple[bool, float | None]:
    """The length of the schedule's period around ``now`` (``audit.period_seconds``: its first
    fire after ``now`` to the fire after that) as the row's list implies it: (True, seconds), or
    (False, None) when the list does not reach that far."""
    fires = row.next_fires
    if now < row.decided_through:
        return False, None
    for i, fire in enumerate(fires):
        if fire > now:
            if i + 1 < len(fires):
                return True, (fires[i + 1] - fire).total_seconds()
            break
    return False, None


def missing_at(row: Any, now: datetime) -> tuple[bool, int]:
    """The row's missing periods still within the hour before ``now`` (``AUDIT_WINDOW``):
    those of its own hour less the ones that have left the window since. (True, count), or
    (False, 0) when more have left than the row kept the instants of."""
    total = row.missing_last_hour or 0
    kept = row.missing_first
    since = now - AUDIT_WINDOW
    gone = sum(1 for at in kept if at < since)
    if gone == len(kept) and len(kept) < total:
        return False, 0
    return True, total - gone
