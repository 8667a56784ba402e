"""Statements behind ``history``, ``status`` and the metrics collector: read-only, one function
per statement. Each takes a SQLAlchemy connection (or a raw psycopg one) whose search_path names
the schema; timestamps come back in UTC (``session_utc``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import psycopg
import sqlalchemy as sa

from cronkeeper.db.engine import driver

# A schedule's recorded periods with their jobs, shaped as ``audit.Record`` (after the
# schedule's name when {name} is "p.schedule,"): instants as Unix seconds, in binary.
_PERIOD_RECORDS = """
SELECT {name} floor(extract(epoch FROM p.scheduled_for))::int8, p.outcome, p.reason,
       CASE WHEN p.outcome = 'emitted' THEN
           extract(epoch FROM coalesce(o.created_at, p.decided_at))::float8 END,
       o.state, o.attempts
FROM periods p
LEFT JOIN outbox o ON o.schedule = p.schedule AND o.scheduled_for = p.scheduled_for
                  AND p.outcome = 'emitted'
WHERE {which} AND p.scheduled_for >= %(a)s AND p.scheduled_for <= %(b)s
ORDER BY {name} p.scheduled_for, o.id
"""
_PERIODS_RANGE = _PERIOD_RECORDS.format(name="", which="p.schedule = %(s)s")
_PERIODS_RANGE_MANY = _PERIOD_RECORDS.format(name="p.schedule,",
                                             which="p.schedule = ANY(%(s)s::text[])")


def periods_range(
    conn: sa.Connection | psycopg.Connection, schedule: str, since: datetime, until: datetime
) -> list[tuple]:
    """One schedule's recorded periods in ``[since, until]`` with their jobs, ascending, shaped
    as ``audit.Record``: (scheduled_for as Unix seconds, outcome, reason, emitted_at as Unix
    seconds, job state, job attempts). Instants travel as numbers in binary: a year of a
    minutely schedule is half a million rows. One range scan of the periods primary key; the
    job comes from the outbox's (schedule, scheduled_for) index."""
    with driver(conn).cursor(binary=True) as cur:
        cur.execute(_PERIODS_RANGE, {"s": schedule, "a": since, "b": until})
        return cur.fetchall()


def periods_range_many(
    conn: sa.Connection | psycopg.Connection, schedules: Sequence[str], since: datetime,
    until: datetime,
) -> dict[str, list[tuple]]:
    """``periods_range`` for many schedules in one statement: schedule -> its rows (same shape,
    ascending). One range scan of the periods primary key per schedule, in one round trip."""
    out: dict[str, list[tuple]] = {name: [] for name in schedules}
    with driver(conn).cursor(binary=True) as cur:
        cur.execute(_PERIODS_RANGE_MANY, {"s": list(schedules), "a": since, "b": until})
        for row in cur:
            out[row[0]].append(row[1:])
    return out


def periods_latest(
    conn: sa.Connection | psycopg.Connection, schedules: Sequence[str]
) -> dict[str, tuple]:
    """Each schedule's latest decided period: (scheduled_for, outcome, reason, decided_at,
    job state). One index probe per schedule."""
    if not schedules:
        return {}
    rows = driver(conn).execute(
        """
        SELECT s, p.scheduled_for, p.outcome, p.reason, p.decided_at, o.state
        FROM unnest(%s::text[]) AS s
        CROSS JOIN LATERAL (SELECT * FROM periods WHERE schedule = s
                            ORDER BY scheduled_for DESC LIMIT 1) p
        LEFT JOIN LATERAL (SELECT state FROM outbox WHERE schedule = s
                           AND scheduled_for = p.scheduled_for ORDER BY id LIMIT 1) o ON true
        """,
        (list(schedules),),
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def periods_last_emitted(
    conn: sa.Connection | psycopg.Connection, schedules: Sequence[str]
) -> dict[str, datetime]:
    """Each schedule's latest emitted period (a backward scan of the primary key)."""
    if not schedules:
        return {}
    rows = driver(conn).execute(
        """
        SELECT s, (SELECT max(scheduled_for) FROM periods
                   WHERE schedule = s AND outcome = 'emitted')
        FROM unnest(%s::text[]) AS s
        """,
        (list(schedules),),
    ).fetchall()
    return {s: t for s, t in rows if t is not None}
