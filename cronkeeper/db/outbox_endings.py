"""How a held job ends, fenced: completed (``outbox_complete``), failed to retry or dead
(``outbox_fail``), handed back without counting the attempt (``outbox_defer``), or handed on by a
relay (``outbox_mark_published``). Each records the attempt's outcome in ``attempts`` in the same
statement.

Every one of them is *fenced*: it matches ``state = 'running'``, ``leased_by`` and ``attempts``
(the attempt number the holder claimed), so a worker (or relay) whose lease expired and whose job
another took can no longer complete, fail or release it. The batched fences spell the state check
``(state = 'running') IS TRUE``, for the reason ``db/outbox_claims.py`` gives.

Each batched statement is given its rows in ascending id order (the callers' arrays are sorted
here: on an outbox of any size the plan walks them in order, by primary key). A small or fresh
outbox is scanned whole, in physical order, so that order is not a promise; what keeps an ending
out of a deadlock with the heartbeat over the same jobs is that the heartbeat never waits for a
job another transaction holds (``outbox_claims.outbox_lease_extend``: SKIP LOCKED).

With ``note`` (a schema with the notifications tables: migrations/0013), a statement that
dead-letters jobs or completes them also notes it for the people to tell, in the same statement
(``db/notifications.py``): a ``dead`` notification per schedule not already dead, a
``recovered`` one per schedule that was.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa

from cronkeeper.db.engine import driver, translate_errors
from cronkeeper.db.notifications import (
    ENDED_COLUMNS,
    notifications_noting_dead,
    notifications_noting_recovered,
)
from cronkeeper.db.wake import wake

_COMPLETE = """
WITH done AS (
    UPDATE outbox o
    SET state = 'succeeded', finished_at = now() - make_interval(secs => coalesce(d.age, 0)),
        leased_by = NULL, lease_expires_at = NULL, last_error = NULL
    FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(ages)s::float8[]) AS d(id, attempt, age)
    WHERE o.id = d.id AND o.attempts = d.attempt AND (o.state = 'running') IS TRUE
      AND o.leased_by = %(worker)s
    RETURNING o.id, o.attempts, d.age{noted_columns}
), recorded AS (
    UPDATE attempts a
    SET finished_at = clock_timestamp() - make_interval(secs => coalesce(done.age, 0)),
        outcome = 'succeeded'
    FROM done WHERE a.job_id = done.id AND a.attempt = done.attempts
){noting}
SELECT id FROM done{woke}
"""


# As _COMPLETE, also writing each attempt's output (migrations/0010; a schema without the column
# gets _COMPLETE: docs/worker.md, "What a job printed"). The outputs travel in binary (%b): as
# text, psycopg escapes a bytea array byte by byte in Python, 47 us per 1 KiB output (measured
# with benchmarks/output_capture.py), against well under 1 us this way.
_COMPLETE_KEEPING_OUTPUT = """
WITH d AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(ages)s::float8[],
                         %(outputs)b::bytea[]) AS d(id, attempt, age, output)
), done AS (
    UPDATE outbox o
    SET state = 'succeeded', finished_at = now() - make_interval(secs => coalesce(d.age, 0)),
        leased_by = NULL, lease_expires_at = NULL, last_error = NULL
    FROM d
    WHERE o.id = d.id AND o.attempts = d.attempt AND (o.state = 'running') IS TRUE
      AND o.leased_by = %(worker)s
    RETURNING o.id, o.attempts, d.age, d.output{noted_columns}
), recorded AS (
    UPDATE attempts a
    SET finished_at = clock_timestamp() - make_interval(secs => coalesce(done.age, 0)),
        outcome = 'succeeded', output = done.output
    FROM done WHERE a.job_id = done.id AND a.attempt = done.attempts
){noting}
SELECT id FROM done{woke}
"""


@functools.cache
def _complete_sql(keep_output: bool, note: bool) -> str:
    """The completion statement: with the attempts' outputs or not, noting recoveries or not."""
    sql = _COMPLETE_KEEPING_OUTPUT if keep_output else _COMPLETE
    if not note:
        return sql.format(noted_columns="", noting="", woke="")
    return sql.format(noted_columns=", o.state, " + ENDED_COLUMNS,
                      noting=notifications_noting_recovered("done"), woke=", recovered_woke")


def _sorted(ids: list[int], *columns: list[Any] | None) -> tuple[list[int], list[list[Any] | None]]:
    """``ids`` in ascending order, each other column (None stays None) in the same order."""
    if all(a <= b for a, b in zip(ids, ids[1:], strict=False)):
        return ids, list(columns)
    order = sorted(range(len(ids)), key=ids.__getitem__)
    return ([ids[k] for k in order],
            [None if c is None else [c[k] for k in order] for c in columns])


def outbox_complete(
    conn: sa.Connection, *, worker_id: str, ids: list[int], attempts: list[int],
    ages: list[float] | None = None, outputs: list[bytes | None] | None = None,
    note: bool = False,
) -> list[int]:
    """Mark jobs succeeded (fenced); returns the ids that were still this worker's.

    ``ages``: for each job, how many seconds ago its attempt ended (an ending kept in memory
    while the database was away is recorded with the instant it happened, not the instant the
    database came back); None when they end now (a handler's transaction commits its own).
    ``outputs``: what each attempt printed (None: nothing kept), written with the attempt's
    end; ``outputs=None`` writes none, as on a schema without ``attempts.output``. ``note``:
    note the recoveries (a schema with the notifications tables)."""
    ids, (attempts, ages, outputs) = _sorted(ids, attempts, ages, outputs)  # type: ignore[assignment]
    params: dict[str, Any] = {"ids": _int_array(ids), "attempts": _int_array(attempts),
                              "ages": None if ages is None else _float_array(ages),
                              "worker": worker_id}
    if outputs is not None:
        params["outputs"] = outputs
    sql = _complete_sql(outputs is not None, note)
    return [r[0] for r in driver(conn).execute(sql, params, binary=True).fetchall()]


async def outbox_complete_async(
    conn: psycopg.AsyncConnection, *, worker_id: str, ids: list[int], attempts: list[int],
    outputs: list[bytes | None] | None = None, note: bool = False,
) -> list[int]:
    """``outbox_complete`` (fenced) on an async connection (an ``async def`` handler's), with
    the attempts' outputs when given and noting recoveries with ``note`` (as ``outbox_complete``)."""
    params: dict[str, Any] = {"ids": ids, "attempts": attempts, "ages": None, "worker": worker_id}
    if outputs is not None:
        params["outputs"] = outputs
    sql = _complete_sql(outputs is not None, note)
    with translate_errors("completing the job"):
        cur = await conn.execute(sql, params, binary=True)
        return [r[0] for r in await cur.fetchall()]


def _int_array(values: list[int]) -> str:
    """A PostgreSQL array literal of integers: on the hot path, one ``str.join`` costs a tenth of
    the driver's per-element array adapter."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _float_array(values: list[float]) -> str:
    """A PostgreSQL array literal of float8, for the same reason as ``_int_array``."""
    return "{" + ",".join(map(repr, map(float, values))) + "}"


# The failure statements' shared middle: the fenced update of the jobs (each to its next state,
# its last_error) and the start of the attempts' closing, which each statement ends its own way.
_FAIL_JOBS = """
), done AS (
    UPDATE outbox o
    SET state = f.state, leased_by = NULL, lease_expires_at = NULL, last_error = f.last_error,
        run_after = CASE WHEN f.state = 'available'
                         THEN now() + make_interval(secs => f.delay) ELSE o.run_after END,
        finished_at = CASE WHEN f.state = 'dead' THEN now() - make_interval(secs => f.age) END
    FROM f
    WHERE o.id = f.id AND o.attempts = f.attempt AND (o.state = 'running') IS TRUE
      AND o.leased_by = %(worker)s
    RETURNING o.id, o.attempts, o.state{noted_columns}
), recorded AS (
    UPDATE attempts a
    SET finished_at = clock_timestamp() - make_interval(secs => f.age), outcome = f.outcome,
        error = f.error"""
_FAIL_END = """
    FROM done JOIN f ON f.id = done.id
    WHERE a.job_id = done.id AND a.attempt = done.attempts
), woke AS (""" + wake("done WHERE state = 'available'") + """){noting}
SELECT id FROM done, woke{woke}
"""

_FAIL = """
WITH f AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(states)s::text[],
                         %(delays)s::float8[], %(errors)s::text[], %(outcomes)s::text[],
                         %(ages)s::float8[], %(last_errors)s::text[])
             AS f(id, attempt, state, delay, error, outcome, age, last_error)""" + _FAIL_JOBS + _FAIL_END

# As _FAIL, also writing each attempt's output (migrations/0010; binary, as for completions).
_FAIL_KEEPING_OUTPUT = """
WITH f AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(states)s::text[],
                         %(delays)s::float8[], %(errors)s::text[], %(outcomes)s::text[],
                         %(ages)s::float8[], %(last_errors)s::text[], %(outputs)b::bytea[])
             AS f(id, attempt, state, delay, error, outcome, age, last_error, output)""" + (
    _FAIL_JOBS + ", output = f.output" + _FAIL_END)


@functools.cache
def _fail_sql(keep_output: bool, note: bool) -> str:
    """The failure statement: with the attempts' outputs or not, noting dead letters or not."""
    sql = _FAIL_KEEPING_OUTPUT if keep_output else _FAIL
    if not note:
        return sql.format(noted_columns="", noting="", woke="")
    return sql.format(noted_columns=", " + ENDED_COLUMNS,
                      noting=notifications_noting_dead("done"), woke=", dead_woke")


@dataclass(frozen=True, slots=True)
class Failure:
    """How one attempt ended badly: the job's next state and the attempt's outcome."""

    id: int
    attempt: int
    state: str  # 'available' (retry after delay) or 'dead'
    delay: float
    error: str
    outcome: str  # attempts.outcome: retry | dead | timeout | released
    age: float = 0.0  # seconds since the attempt ended (recorded late: the database was away)
    output: bytes | None = None  # what the attempt printed (None: nothing kept)
    last_error: str | None = None  # the job's last_error when not ``error`` (the output's tail)


def outbox_fail(conn: sa.Connection, *, worker_id: str, failures: list[Failure],
                keep_output: bool = False, note: bool = False) -> list[int]:
    """Record failed attempts and move their jobs to retry or dead letter (fenced); each job's
    ``last_error`` is its failure's ``last_error`` (default: its ``error``). ``keep_output``:
    write each attempt's output too (a schema with ``attempts.output``). ``note``: note the
    dead letters (a schema with the notifications tables)."""
    failures = sorted(failures, key=lambda f: f.id)
    params: dict[str, Any] = {
        "ids": [f.id for f in failures],
        "attempts": [f.attempt for f in failures],
        "states": [f.state for f in failures],
        "delays": [f.delay for f in failures],
        "errors": [f.error for f in failures],
        "outcomes": [f.outcome for f in failures],
        "ages": [f.age for f in failures],
        "last_errors": [f.error if f.last_error is None else f.last_error for f in failures],
        "worker": worker_id,
    }
    if keep_output:
        params["outputs"] = [f.output for f in failures]
    return [r[0] for r in driver(conn).execute(_fail_sql(keep_output, note), params).fetchall()]


_DEFER = """
WITH back AS (
    UPDATE outbox o
    SET state = 'available', attempts = o.attempts - 1, leased_by = NULL,
        lease_expires_at = NULL, last_error = %(reason)s,
        run_after = now() + make_interval(secs => %(delay)s)
    WHERE o.id = %(id)s AND o.attempts = %(attempt)s AND o.state = 'running'
      AND o.leased_by = %(worker)s
    RETURNING o.id
), forgotten AS (
    DELETE FROM attempts a USING back WHERE a.job_id = back.id AND a.attempt = %(attempt)s
), woke AS (""" + wake("back") + """)
SELECT woke FROM woke
"""


def outbox_defer(
    conn: sa.Connection, *, worker_id: str, job_id: int, attempt: int, delay: float, reason: str
) -> None:
    """Hand a job back without counting the attempt (this worker lacks its schedule version)."""
    params = {"id": job_id, "attempt": attempt, "worker": worker_id, "delay": delay, "reason": reason}
    driver(conn).execute(_DEFER, params)


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
    """Mark jobs a relay handed to their target published (fenced, like a worker's
    completion). Returns, per id still this relay's, the seconds from when the job became due
    (its commit, or its ``run_after`` when later) to this statement."""
    ids, (attempts, targets, target_ids) = _sorted(ids, attempts, targets, target_ids)  # type: ignore[assignment]
    params = {"ids": ids, "attempts": attempts, "targets": targets, "target_ids": target_ids,
              "relay": relay_id}
    return {r[0]: float(r[1]) for r in driver(conn).execute(_MARK, params).fetchall()}
