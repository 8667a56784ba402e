"""The ``notification_subjects`` table (migrations/0013): per schedule, or per task for jobs
without one, what keeps a flood of dead letters to one notification. It is written by the
statements that dead-letter or complete jobs (``db/notifications.py``'s noting fragments) and by
the leader's audit (``notifications_note_missing``); read here for the metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cronkeeper.db.engine import driver, one_row

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


def subjects_suppressed(conn: sa.Connection) -> int:
    """Dead letters counted instead of sent, fleet-wide, since the schema was made."""
    return int(one_row(driver(conn).execute(
        "SELECT coalesce(sum(suppressed_total), 0) FROM notification_subjects"))[0])


def subjects_missing_through(conn: sa.Connection | Any, schedules: list[str]) -> dict[str, Any]:
    """The latest missing period already told, per schedule (those with one)."""
    return dict(driver(conn).execute(
        "SELECT name, missing_through FROM notification_subjects WHERE kind = 'schedule' "
        "AND name = ANY(%(s)s::text[]) AND missing_through IS NOT NULL", {"s": schedules}
    ).fetchall())
