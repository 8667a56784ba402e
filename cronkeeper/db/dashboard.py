"""Statements behind ``cronkeeper web`` that the CLI does not already have: read-only, one
function per statement, each naming the index it relies on. The rest of the web's reads are
the same functions as ``status``, ``history``, ``dlq`` and the metrics (``db/audit.py``,
``db/attempts.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
import sqlalchemy as sa

from cronkeeper.db.audit import raw


def snapshot_one(conn: sa.Connection | psycopg.Connection) -> None:
    """The rest of this transaction reads one snapshot (REPEATABLE READ, read only): a page
    that reads the same periods twice (a state filter, then the shown strips) sees them
    once. The first statement of the transaction."""
    raw(conn).execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


def versions_stamp(conn: sa.Connection | psycopg.Connection) -> tuple[int, int]:
    """(highest id, row count) of ``schedule_versions``: versions are only ever appended, so an
    unchanged stamp means the parsed versions a reader keeps are still current. An index-only
    look at the primary key plus a count."""
    row = raw(conn).execute(
        "SELECT coalesce(max(id), 0), count(*) FROM schedule_versions"
    ).fetchone()
    return int(row[0]), int(row[1])


PERIODS_WINDOWS = """
SELECT w.s, floor(extract(epoch FROM p.scheduled_for))::int8, p.outcome, p.reason,
       CASE WHEN p.outcome = 'emitted' THEN
           extract(epoch FROM coalesce(o.created_at, p.decided_at))::float8 END,
       o.state, o.attempts
FROM unnest(%(names)s::text[], %(sinces)s::timestamptz[]) AS w(s, since)
JOIN periods p ON p.schedule = w.s AND p.scheduled_for >= w.since
              AND p.scheduled_for <= %(until)s
LEFT JOIN outbox o ON o.schedule = p.schedule AND o.scheduled_for = p.scheduled_for
                  AND p.outcome = 'emitted'
ORDER BY w.s, p.scheduled_for, o.id
"""


def versions_after(
    conn: sa.Connection | psycopg.Connection, after_id: int
) -> list[tuple[int, str, dict[str, Any] | None, datetime]]:
    """Versions recorded after ``after_id`` (id, schedule, spec, active_from), in id order: a
    range scan of the primary key. Readers that keep parsed versions read only what is new."""
    return raw(conn).execute(
        "SELECT id, schedule, spec, active_from FROM schedule_versions WHERE id > %s ORDER BY id",
        (after_id,),
    ).fetchall()


def periods_windows(
    conn: sa.Connection | psycopg.Connection, windows: Sequence[tuple[str, datetime]],
    until: datetime,
) -> dict[str, list[tuple]]:
    """Each schedule's recorded periods in ``[since, until]`` (one ``since`` per schedule), with
    their jobs, ascending, shaped as ``audit.Record`` like ``periods_range``. One statement for a
    whole page of schedules: a range scan of the periods primary key per schedule, the job from
    the outbox's ``outbox_schedule_period`` index."""
    out: dict[str, list[tuple]] = {name: [] for name, _ in windows}
    if not windows:
        return out
    with raw(conn).cursor(binary=True) as cur:
        cur.execute(
            PERIODS_WINDOWS,
            {"names": [n for n, _ in windows], "sinces": [s for _, s in windows],
             "until": until},
        )
        for row in cur:
            out[row[0]].append(row[1:])
    return out


PERIODS_WINDOW_STATES = """
SELECT w.s, array_agg(floor(date_part('epoch', p.scheduled_for))::int8),
       string_agg(CASE WHEN p.outcome = 'emitted' THEN 'E' ELSE 'S' END, '')
FROM unnest(%(names)s::text[], %(sinces)s::timestamptz[]) AS w(s, since)
JOIN periods p ON p.schedule = w.s AND p.scheduled_for >= w.since
              AND p.scheduled_for <= %(until)s
GROUP BY w.s
"""

PERIODS_WINDOW_INSTANTS = """
SELECT w.s, array_agg(floor(date_part('epoch', p.scheduled_for))::int8)
FROM unnest(%(names)s::text[], %(sinces)s::timestamptz[]) AS w(s, since)
JOIN periods p ON p.schedule = w.s AND p.scheduled_for >= w.since
              AND p.scheduled_for <= %(until)s
GROUP BY w.s
"""

JOBS_WINDOW_DEAD_RUNNING = """
SELECT d.schedule, floor(extract(epoch FROM d.scheduled_for))::int8, d.state
FROM unnest(%(names)s::text[], %(sinces)s::timestamptz[]) AS w(s, since)
JOIN outbox d ON d.schedule = w.s AND d.scheduled_for >= w.since
             AND d.scheduled_for <= %(until)s
WHERE d.state IN ('dead', 'running')
  AND NOT EXISTS (SELECT 1 FROM outbox e WHERE e.schedule = d.schedule
                  AND e.scheduled_for = d.scheduled_for AND e.id < d.id)
"""


def periods_window_states(
    conn: sa.Connection | psycopg.Connection, windows: Sequence[tuple[str, datetime]],
    until: datetime, *, outcomes: bool = True, jobs: bool = True,
) -> dict[str, dict[int, str]]:
    """Each schedule's recorded periods in ``[since, until]`` as Unix second -> letter, in no
    particular order (``period_states.audit_states`` sorts), with its letters: S skipped,
    E emitted, D or R when the period's job (its first, as ``periods_windows`` joins it) is
    dead or running. Without ``jobs`` emitted periods are all E; without ``outcomes`` every
    period is E (which periods were recorded is all a missing or pending filter needs, and
    ``periods_pkey`` holds it). For the page's state filters: one row (an array and a string)
    per schedule, and of the outbox only the dead and running jobs, each checked to be its
    period's first job through ``outbox_schedule_period``. Over every schedule the windows
    cover most of the table, and the planner may rightly scan it whole (docs/web.md)."""
    out: dict[str, dict[int, str]] = {name: {} for name, _ in windows}
    if not windows:
        return out
    params = {"names": [n for n, _ in windows], "sinces": [s for _, s in windows],
              "until": until}
    db = raw(conn)
    with db.cursor(binary=True) as cur:  # int8[] arrives as ints, parsed by the driver
        if outcomes:  # both aggregates see the group's rows in one order: they line up
            for name, instants, letters in cur.execute(PERIODS_WINDOW_STATES, params):
                out[name] = dict(zip(instants, letters, strict=True))
        else:
            for name, instants in cur.execute(PERIODS_WINDOW_INSTANTS, params):
                out[name] = dict.fromkeys(instants, "E")
    if outcomes and jobs:
        for name, at, state in db.execute(JOBS_WINDOW_DEAD_RUNNING, params):
            periods = out[name]
            if periods.get(at) == "E":
                periods[at] = "D" if state == "dead" else "R"
    return out


def instances_all(conn: sa.Connection | psycopg.Connection, cluster: str) -> list[dict[str, Any]]:
    """Every registered instance of the cluster, stale ones too, with its heartbeat's age in
    seconds (the primary key's cluster prefix)."""
    cur = raw(conn).execute(
        """
        SELECT instance_id, kind, host, pid, version, schedules_digest, tzdata_version, role,
               started_at, heartbeat_at, clock_skew_seconds,
               extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 AS heartbeat_age
        FROM instances WHERE cluster = %(c)s
        ORDER BY kind, instance_id
        """,
        {"c": cluster},
    )
    names = [d.name for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def outbox_attempts_per_job(
    conn: sa.Connection | psycopg.Connection, seconds: float
) -> tuple[int, int, int]:
    """Jobs that finished (succeeded, published or dead) in the last ``seconds``: (jobs, their
    attempts in total, the most attempts one took). The ``outbox_finished`` and ``outbox_dead``
    partial indexes on ``finished_at``."""
    row = raw(conn).execute(
        """
        SELECT count(*), coalesce(sum(attempts), 0), coalesce(max(attempts), 0) FROM outbox
        WHERE state IN ('succeeded', 'published', 'dead')
          AND finished_at > clock_timestamp() - make_interval(secs => %(s)s)
        """,
        {"s": seconds},
    ).fetchone()
    return int(row[0]), int(row[1]), int(row[2])
