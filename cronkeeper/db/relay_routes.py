"""The ``relay_routes`` table: which jobs each relay takes (``relay_routes_register``, at its
start), so that workers' claims skip them (``db/outbox_claims.py``); ``status`` lists them. The
relay's other statements are the outbox's: the claim it shares with workers
(``db/outbox_claims.py``), its fenced ``outbox_mark_published`` (``db/outbox_endings.py``), and
the completion polling of published jobs (``db/outbox.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from cronkeeper.db.engine import driver

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


@dataclass(frozen=True, slots=True)
class RouteRow:
    position: int
    target: str
    tasks: list[str] | None
    schedules: list[str] | None
    task_regex: str | None
    schedule_regex: str | None


def relay_routes_register(conn: sa.Connection, *, relay: str, routes: list[RouteRow]) -> None:
    """Replace the routes registered under ``relay`` (one transaction: the caller's)."""
    pg = driver(conn)
    pg.execute("DELETE FROM relay_routes WHERE relay = %(relay)s", {"relay": relay})
    for r in routes:
        pg.execute(
            """
            INSERT INTO relay_routes (relay, position, target, tasks, schedules, task_regex,
                                      schedule_regex)
            VALUES (%(relay)s, %(position)s, %(target)s, %(tasks)s, %(schedules)s,
                    %(task_regex)s, %(schedule_regex)s)
            """,
            {"relay": relay, "position": r.position, "target": r.target, "tasks": r.tasks,
             "schedules": r.schedules, "task_regex": r.task_regex,
             "schedule_regex": r.schedule_regex},
        )


def relay_routes_list(conn: sa.Connection) -> list[tuple[str, int, str, list | None, list | None]]:
    """(relay, position, target, tasks, schedules) of every registered route."""
    return driver(conn).execute(
        "SELECT relay, position, target, tasks, schedules FROM relay_routes ORDER BY 1, 2"
    ).fetchall()
