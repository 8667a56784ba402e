"""The ``schedule_controls`` table: what an operator set on a schedule (paused or not, when,
by whom). The leader reads it each tick; ``status`` and the web show it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg

from cronkeeper.db.engine import driver

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


def controls_paused(conn: sa.Connection | psycopg.Connection) -> set[str]:
    """The schedules paused now."""
    return {r[0] for r in driver(conn).execute(
        "SELECT schedule FROM schedule_controls WHERE paused")}


def controls_set(conn: sa.Connection | psycopg.Connection, schedule: str, paused: bool,
                 changed_by: str) -> None:
    """Pause or resume ``schedule`` (``changed_by``: who asked)."""
    driver(conn).execute(
        """
        INSERT INTO schedule_controls (schedule, paused, changed_by)
        VALUES (%(schedule)s, %(paused)s, %(by)s)
        ON CONFLICT (schedule) DO UPDATE
           SET paused = excluded.paused, changed_at = clock_timestamp(),
               changed_by = excluded.changed_by
        """,
        {"schedule": schedule, "paused": paused, "by": changed_by},
    )
