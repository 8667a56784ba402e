"""The ``periods`` table, read: one row per decided period of a schedule (emitted or skipped,
and why), written only by the claim (``db/periods_claims.py``). The leader asks which periods
are decided (``periods_last``, ``periods_decided``); ``history``, ``status``, the web and the
metrics read the recorded periods with their jobs (``periods_range`` for one schedule,
``periods_windows`` for many), the latest of each (``periods_latest``, ``periods_last_emitted``)
or their states packed for the web's filters (``periods_window_states``); ``explain`` reads one
(``periods_get``). Timestamps come back in the session's time zone (``session_utc``)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from cronkeeper.db.engine import driver

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


def periods_last(conn: psycopg.Connection, schedules: Sequence[str]) -> dict[str, datetime]:
    """The latest period each schedule's leaders decided (one index probe per schedule).

    Operator backfills (term 0) do not count: a backfill of a later window must not make a new
    leader skip the undecided periods before it; those lose their insert to the backfill."""
    if not schedules:
        return {}
    rows = conn.execute(
        """
        SELECT s, (SELECT max(scheduled_for) FROM periods p WHERE p.schedule = s AND p.term > 0)
        FROM unnest(%s::text[]) AS s
        """,
        (list(schedules),),
    ).fetchall()
    return {s: last for s, last in rows if last is not None}


def periods_decided(
    conn: psycopg.Connection, schedule: str, start: datetime, end: datetime
) -> set[datetime]:
    rows = conn.execute(
        """
        SELECT scheduled_for FROM periods
        WHERE schedule = %s AND scheduled_for > %s AND scheduled_for <= %s
        """,
        (schedule, start, end),
    )
    return {r[0] for r in rows}


_PERIOD = """
SELECT p.schedule, p.scheduled_for, p.outcome, p.reason, p.decided_at, p.term, p.version_id,
       v.digest
FROM periods p LEFT JOIN schedule_versions v ON v.id = p.version_id
WHERE p.schedule = %(schedule)s AND p.scheduled_for = %(at)s
"""


def periods_get(conn: sa.Connection, schedule: str, scheduled_for: datetime) -> dict[str, Any] | None:
    cur = driver(conn).cursor(row_factory=dict_row)
    return cur.execute(_PERIOD, {"schedule": schedule, "at": scheduled_for}).fetchone()


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


_PERIODS_RANGE = """
SELECT floor(extract(epoch FROM p.scheduled_for))::int8, p.outcome, p.reason,
       CASE WHEN p.outcome = 'emitted' THEN
           extract(epoch FROM coalesce(o.created_at, p.decided_at))::float8 END,
       o.state, o.attempts
FROM periods p
LEFT JOIN outbox o ON o.schedule = p.schedule AND o.scheduled_for = p.scheduled_for
                  AND p.outcome = 'emitted'
WHERE p.schedule = %(s)s AND p.scheduled_for >= %(a)s AND p.scheduled_for <= %(b)s
ORDER BY p.scheduled_for, o.id
"""


def periods_range(
    conn: sa.Connection | psycopg.Connection, schedule: str, since: datetime, until: datetime
) -> list[tuple]:
    """One schedule's recorded periods in ``[since, until]`` with their jobs, ascending, shaped
    as ``periods_windows`` gives them (``history``, the web's schedule page).

    Not ``periods_windows`` for one name: given the schedule as a value, the planner sees how
    many periods the range holds, reads them in the primary key's order and merges the outbox
    in (an incremental sort); through ``periods_windows``' unnest it probes the outbox once per
    period and sorts them all. A year of a minutely schedule among 300 others: 1.4-2.1 s this
    way, 3.5-5.3 s the other (three runs each, alternating; the 2-core development machine)."""
    with driver(conn).cursor(binary=True) as cur:
        cur.execute(_PERIODS_RANGE, {"s": schedule, "a": since, "b": until})
        return cur.fetchall()


# A schedule's recorded periods with their jobs, shaped as ``audit.Record`` after the schedule's
# name: instants as Unix seconds, in binary.
PERIODS_WINDOWS = """
SELECT w.s, floor(extract(epoch FROM p.scheduled_for))::int8, p.outcome, p.reason,
       CASE WHEN p.outcome = 'emitted' THEN
           extract(epoch FROM coalesce(o.created_at, p.decided_at))::float8 END,
       o.state, o.attempts
FROM unnest(%(names)b::text[], %(sinces)b::timestamptz[]) AS w(s, since)
JOIN periods p ON p.schedule = w.s AND p.scheduled_for >= w.since
              AND p.scheduled_for <= %(until)s
LEFT JOIN outbox o ON o.schedule = p.schedule AND o.scheduled_for = p.scheduled_for
                  AND p.outcome = 'emitted'
ORDER BY w.s, p.scheduled_for, o.id
"""


def periods_windows(
    conn: sa.Connection | psycopg.Connection, windows: Sequence[tuple[str, datetime]],
    until: datetime,
) -> dict[str, list[tuple]]:
    """Each schedule's recorded periods in ``[since, until]`` (one ``since`` per schedule), with
    their jobs, ascending: schedule -> rows shaped as ``audit.Record``: (scheduled_for as Unix
    seconds, outcome, reason, emitted_at as Unix seconds, job state, job attempts); a period
    with two jobs comes once per job, its first first. Instants travel as numbers in binary: a
    year of a minutely schedule is half a million rows. One statement for a whole page of
    schedules (one schedule alone: ``periods_range``): a range scan of the periods primary key
    per schedule, the job from the outbox's ``outbox_schedule_period`` index."""
    out: dict[str, list[tuple]] = {name: [] for name, _ in windows}
    if not windows:
        return out
    with driver(conn).cursor(binary=True) as cur:
        cur.execute(
            PERIODS_WINDOWS,
            {"names": [n for n, _ in windows], "sinces": [s for _, s in windows],
             "until": until},
        )
        for row in cur:
            out[row[0]].append(row[1:])
    return out


# One row per schedule, its periods aggregated by a subquery that walks the schedule's range of
# ``periods_pkey`` (no hash aggregate over every schedule, nothing spilled to disk). Instants
# travel packed, as big-endian int8 bytes (``int8send``): the driver hands back one ``bytes``
# per schedule and ``array`` unpacks it in C. Both aggregates of one subquery see its rows in
# one order, so the instants and the letters line up.
PERIODS_WINDOW_STATES = """
SELECT w.s, x.instants, x.letters
FROM unnest(%(names)b::text[], %(sinces)b::timestamptz[]) AS w(s, since)
CROSS JOIN LATERAL (
    SELECT string_agg(int8send(floor(date_part('epoch', p.scheduled_for))::int8), ''::bytea)
               AS instants,
           string_agg(CASE WHEN p.outcome = 'emitted' THEN 'E' ELSE 'S' END, '') AS letters
    FROM periods p
    WHERE p.schedule = w.s AND p.scheduled_for >= w.since AND p.scheduled_for <= %(until)s
) x
"""


PERIODS_WINDOW_INSTANTS = """
SELECT w.s, (
    SELECT string_agg(int8send(floor(date_part('epoch', p.scheduled_for))::int8), ''::bytea)
    FROM periods p
    WHERE p.schedule = w.s AND p.scheduled_for >= w.since AND p.scheduled_for <= %(until)s)
FROM unnest(%(names)b::text[], %(sinces)b::timestamptz[]) AS w(s, since)
"""


# Dead jobs from the ``outbox_dead`` partial index, running ones from a partial index of the
# unfinished (``outbox_unfinished_by_schedule`` in the plans seen): never a scan of the whole
# outbox. The hits are materialized first and each then checked to be its period's first job by
# one ``outbox_schedule_period`` probe; written as NOT EXISTS, the planner hashed the whole
# outbox for an anti join instead.
JOBS_WINDOW_DEAD_RUNNING = """
WITH hits AS MATERIALIZED (
    SELECT d.id, d.schedule, d.scheduled_for, d.state
    FROM (SELECT id, schedule, scheduled_for, state FROM outbox WHERE state = 'dead'
          UNION ALL
          SELECT id, schedule, scheduled_for, state FROM outbox WHERE state = 'running') d
    JOIN unnest(%(names)b::text[], %(sinces)b::timestamptz[]) AS w(s, since)
      ON d.schedule = w.s AND d.scheduled_for >= w.since AND d.scheduled_for <= %(until)s)
SELECT h.schedule, floor(extract(epoch FROM h.scheduled_for))::int8, h.state
FROM hits h
WHERE h.id = (SELECT min(e.id) FROM outbox e
              WHERE e.schedule = h.schedule AND e.scheduled_for = h.scheduled_for)
"""


def _instants(packed: bytes | None) -> array:
    """Big-endian int8s (``int8send``, concatenated) as an array of ints."""
    out = array("q", packed or b"")
    if sys.byteorder == "little":
        out.byteswap()
    return out


def periods_window_states(
    conn: sa.Connection | psycopg.Connection, windows: Sequence[tuple[str, datetime]],
    until: datetime, *, outcomes: bool = True, jobs: bool = True,
) -> dict[str, dict[int, str]]:
    """Each schedule's recorded periods in ``[since, until]`` as Unix second -> letter, in no
    particular order (``period_states.audit_states`` sorts), with its letters: S skipped,
    E emitted, D or R when the period's job (its first, as ``periods_windows`` joins it) is
    dead or running. Without ``jobs`` emitted periods are all E; without ``outcomes`` every
    period is E (which periods were recorded is all a missing or pending filter needs, and
    ``periods_pkey`` holds it: an index-only scan). For the page's state filters: one row
    per schedule (its instants packed, its letters a string), each a range scan of
    ``periods_pkey``; of the outbox only the dead and running jobs (their partial indexes),
    each checked to be its period's first job through ``outbox_schedule_period``."""
    out: dict[str, dict[int, str]] = {name: {} for name, _ in windows}
    if not windows:
        return out
    params = {"names": [n for n, _ in windows], "sinces": [s for _, s in windows],
              "until": until}
    db = driver(conn)
    with db.cursor(binary=True) as cur:
        if outcomes:
            for name, instants, letters in cur.execute(PERIODS_WINDOW_STATES, params):
                if letters:
                    out[name] = dict(zip(_instants(instants), letters, strict=True))
        else:
            for name, instants in cur.execute(PERIODS_WINDOW_INSTANTS, params):
                out[name] = dict.fromkeys(_instants(instants), "E")
    if outcomes and jobs:
        for name, at, state in db.execute(JOBS_WINDOW_DEAD_RUNNING, params):
            periods = out[name]
            if periods.get(at) == "E":
                periods[at] = "D" if state == "dead" else "R"
    return out
