"""Retention: small batches through the SECURITY DEFINER prune() function (no DELETE grant)."""

from __future__ import annotations

import psycopg

from cronkeeper.db.engine import one_row

DAY_SECONDS = 86400.0


def prune(conn: psycopg.Connection, *, jobs_days: float, periods_days: float, batch: int) -> tuple[int, int, int]:
    """One batch of each retention. The horizons are ``days`` of exact seconds back, as the
    audit's (``audit.Window.clipped``): not calendar days, which the session's time zone would
    make an hour longer or shorter across a DST change, and never a whole number of days cut
    from a fraction. A period pruned after the audit's horizon would show as missing."""
    row = one_row(conn.execute(
        """
        SELECT * FROM prune(clock_timestamp() - make_interval(secs => %(j)s),
                            clock_timestamp() - make_interval(secs => %(p)s), %(b)s)
        """,
        {"j": float(jobs_days) * DAY_SECONDS, "p": float(periods_days) * DAY_SECONDS,
         "b": batch},
    ))
    return int(row[0]), int(row[1]), int(row[2])
