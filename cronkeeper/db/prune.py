"""Retention: small batches through the SECURITY DEFINER prune() function (no DELETE grant)."""

from __future__ import annotations

import psycopg

from cronkeeper.db.engine import one_row


def prune(conn: psycopg.Connection, *, jobs_days: float, periods_days: float, batch: int) -> tuple[int, int, int]:
    row = one_row(conn.execute(
        """
        SELECT * FROM prune(clock_timestamp() - make_interval(days => %(j)s::int),
                            clock_timestamp() - make_interval(days => %(p)s::int), %(b)s)
        """,
        {"j": int(jobs_days), "p": int(periods_days), "b": batch},
    ))
    return int(row[0]), int(row[1]), int(row[2])
