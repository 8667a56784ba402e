"""Statements of ``cronkeeper relay`` beyond the claim it shares with workers (db/outbox.py:
``outbox_claim``, ``outbox_claim_serial``, ``outbox_fail``, ``outbox_defer``, the reaper).

- ``relay_routes_register``: a relay's routes, which workers' claims skip;
- ``outbox_mark_published``: fenced like a worker's completion (``running``, ``leased_by``,
  ``attempts``), so a relay whose lease ran out cannot mark a job another relay took;
- ``outbox_published_open`` / ``outbox_published_finish``: completion polling, for published jobs
  still inside their timeout (after it, overlap no longer waits for them).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from cronkeeper.db.engine import driver


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


_MARK = """
WITH p AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(targets)s::text[],
                         %(target_ids)s::text[]) AS p(id, attempt, target, target_id)
), done AS (
    UPDATE outbox o
    SET state = 'published', published_at = now(), published_to = p.target,
        target_id = p.target_id, leased_by = NULL, lease_expires_at = NULL, last_error = NULL
    FROM p
    WHERE o.id = p.id AND o.attempts = p.attempt AND (o.state = 'running') IS TRUE
      AND o.leased_by = %(relay)s
    RETURNING o.id, o.attempts,
              extract(epoch FROM clock_timestamp() - greatest(o.created_at, o.run_after)) AS due_seconds
), recorded AS (
    UPDATE attempts a SET finished_at = clock_timestamp(), outcome = 'published'
    FROM done WHERE a.job_id = done.id AND a.attempt = done.attempts
)
SELECT id, due_seconds FROM done
"""


def outbox_mark_published(
    conn: sa.Connection, *, relay_id: str, ids: list[int], attempts: list[int],
    targets: list[str], target_ids: list[str],
) -> dict[int, float]:
    """Mark jobs published (fenced). Returns, per id still this relay's, the seconds from when
    the job became due (its commit, or its ``run_after`` when later) to this statement."""
    params = {"ids": ids, "attempts": attempts, "targets": targets, "target_ids": target_ids,
              "relay": relay_id}
    return {r[0]: float(r[1]) for r in driver(conn).execute(_MARK, params).fetchall()}


@dataclass(frozen=True, slots=True)
class Published:
    id: int
    target: str
    target_id: str


def outbox_published_open(conn: sa.Connection, *, targets: list[str], limit: int) -> list[Published]:
    """Published jobs of these targets whose outcome is not recorded, still within their
    timeout since publication, least recently published first."""
    rows = driver(conn).execute(
        """
        SELECT id, published_to, target_id FROM outbox
        WHERE state = 'published' AND finished_at IS NULL AND published_to = ANY(%(t)s::text[])
          AND published_at + make_interval(secs => timeout_seconds) > now()
        ORDER BY published_at
        LIMIT %(limit)s
        """,
        {"t": targets, "limit": limit},
    ).fetchall()
    return [Published(*row) for row in rows]


def outbox_published_finish(conn: sa.Connection, *, ids: list[int], states: list[str]) -> int:
    """Record what targets reported: ``succeeded`` or ``dead`` (the target's own failure), with
    ``finished_at``. Only jobs still ``published`` and unfinished change."""
    return driver(conn).execute(
        """
        UPDATE outbox o
        SET state = f.state, finished_at = now(),
            last_error = CASE WHEN f.state = 'dead'
                              THEN 'the target reported the task failed (' || o.published_to
                                   || ' id ' || o.target_id || ')' END
        FROM unnest(%(ids)s::bigint[], %(states)s::text[]) AS f(id, state)
        WHERE o.id = f.id AND o.state = 'published' AND o.finished_at IS NULL
        """,
        {"ids": ids, "states": states},
    ).rowcount
