"""The ``schedule_controls`` table: what an operator set on a schedule (paused or not, when,
by whom). ``status`` and the web show it; the leader judges periods by the spans of
``schedule_pauses`` written beside it (and by this table for rows older releases wrote)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import psycopg

from cronkeeper.db.engine import driver

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


def controls_paused(conn: sa.Connection | psycopg.Connection) -> set[str]:
    """The schedules paused now."""
    return {r[0] for r in driver(conn).execute(
        "SELECT schedule FROM schedule_controls WHERE paused")}


def controls_lock(conn: sa.Connection | psycopg.Connection,
                  schedule: str) -> tuple[bool, datetime | None]:
    """Lock ``schedule``'s controls row for the rest of the transaction (a pause or resume
    that commits meanwhile is waited for, and then read) and return how it stands: (paused,
    changed_at), or (False, None) when nothing was ever set on it."""
    cur = driver(conn)
    # (a first pause of two at once: the second waits here for the first's row)
    if cur.execute(
        "INSERT INTO schedule_controls (schedule, paused, changed_by)"
        " VALUES (%(s)s, false, '') ON CONFLICT (schedule) DO NOTHING RETURNING 1",
        {"s": schedule},
    ).fetchone() is not None:
        return False, None
    row = cur.execute("SELECT paused, changed_at FROM schedule_controls"
                      " WHERE schedule = %(s)s FOR UPDATE", {"s": schedule}).fetchone()
    return (False, None) if row is None else (bool(row[0]), row[1])


def controls_set(conn: sa.Connection | psycopg.Connection, schedule: str, paused: bool,
                 changed_by: str, at: datetime | None = None) -> None:
    """Pause or resume ``schedule`` (``changed_by``: who asked; ``at``: the instant, the span's
    in schedule_pauses, by default the database's clock now)."""
    driver(conn).execute(
        """
        INSERT INTO schedule_controls (schedule, paused, changed_at, changed_by)
        VALUES (%(schedule)s, %(paused)s, coalesce(%(at)s, clock_timestamp()), %(by)s)
        ON CONFLICT (schedule) DO UPDATE
           SET paused = excluded.paused, changed_at = excluded.changed_at,
               changed_by = excluded.changed_by
        """,
        {"schedule": schedule, "paused": paused, "by": changed_by, "at": at},
    )
