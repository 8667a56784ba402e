"""Statements behind ``cronkeeper web`` that the CLI does not already have: read-only, one
function per statement, each naming the index it relies on. The rest of the web's reads are
the same functions as ``status``, ``history``, ``dlq`` and the metrics (``db/audit.py``,
``db/attempts.py``)."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from datetime import datetime

import psycopg
import sqlalchemy as sa

from cronkeeper.db.engine import driver

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
    their jobs, ascending, shaped as ``audit.Record`` like ``periods_range``. One statement for a
    whole page of schedules: a range scan of the periods primary key per schedule, the job from
    the outbox's ``outbox_schedule_period`` index."""
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
