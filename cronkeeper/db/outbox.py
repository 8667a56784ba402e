"""The ``outbox`` table, beyond the lease path (``db/outbox_claims.py``) and the fenced endings
(``db/outbox_endings.py``): what the leader asks before it decides (``outbox_unfinished``), the
counts behind ``status``, the web and the metrics, the dead letters an operator lists, replays or
discards (``dlq``), one job by its key (``explain``), and the published jobs a relay polls for
their outcome. Applications write their own jobs with ``db/enqueue.py``; the leader writes its
jobs with the periods it claims (``db/periods_claims.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from cronkeeper.db.engine import driver, one_row
from cronkeeper.db.notifications import (
    ENDED_COLUMNS,
    notifications_noting_dead,
    notifications_noting_recovered,
)
from cronkeeper.db.wake import wake

if TYPE_CHECKING:  # (not at run time: the readers of the outbox need none of the claims' code)
    import sqlalchemy as sa

    from cronkeeper.db.periods_claims import JobColumns


def outbox_depth(conn: sa.Connection | psycopg.Connection) -> dict[str, int]:
    """Jobs in the outbox by state."""
    return dict(driver(conn).execute("SELECT state, count(*) FROM outbox GROUP BY state").fetchall())


def outbox_oldest_available(
    conn: sa.Connection | psycopg.Connection,
) -> list[tuple[str, str, float, int]]:
    """Per schedule (and owner): age in seconds of the oldest job that is ready to run
    (available, run_after <= now), and how many are ready. Uses the ``outbox_available`` index."""
    return driver(conn).execute(
        """
        SELECT coalesce(schedule, ''), coalesce(owner, ''),
               extract(epoch FROM clock_timestamp() - min(run_after))::float8, count(*)
        FROM outbox WHERE state = 'available' AND run_after <= clock_timestamp()
        GROUP BY 1, 2
        """
    ).fetchall()


def outbox_retrying(conn: sa.Connection | psycopg.Connection) -> list[tuple[str, str, int]]:
    """Per schedule (and owner): available jobs that already failed at least once."""
    return driver(conn).execute(
        """
        SELECT coalesce(schedule, ''), coalesce(owner, ''), count(*)
        FROM outbox WHERE state = 'available' AND attempts > 0 GROUP BY 1, 2
        """
    ).fetchall()


def outbox_dead(conn: sa.Connection | psycopg.Connection) -> list[tuple[str, str, int]]:
    """Dead letters waiting, per schedule and owner (the ``outbox_dead`` index)."""
    return driver(conn).execute(
        """
        SELECT coalesce(schedule, ''), coalesce(owner, ''), count(*)
        FROM outbox WHERE state = 'dead' GROUP BY 1, 2
        """
    ).fetchall()


def outbox_attempts_per_job(
    conn: sa.Connection | psycopg.Connection, seconds: float
) -> tuple[int, int, int]:
    """Jobs that finished (succeeded, published or dead) in the last ``seconds``: (jobs, their
    attempts in total, the most attempts one took). The ``outbox_finished`` and ``outbox_dead``
    partial indexes on ``finished_at``."""
    row = one_row(driver(conn).execute(
        """
        SELECT count(*), coalesce(sum(attempts), 0), coalesce(max(attempts), 0) FROM outbox
        WHERE state IN ('succeeded', 'published', 'dead')
          AND finished_at > clock_timestamp() - make_interval(secs => %(s)s)
        """,
        {"s": seconds},
    ))
    return int(row[0]), int(row[1]), int(row[2])


def outbox_unfinished(conn: psycopg.Connection, schedules: Sequence[str]) -> set[str]:
    """Schedules whose previous job is not finished: waiting, running, or waiting to retry; or
    published by a relay and neither reported finished nor past its timeout since publication
    (docs/relay.md). Two arms, so each is answered from its partial index."""
    if not schedules:
        return set()
    rows = conn.execute(
        """
        SELECT DISTINCT schedule FROM outbox
        WHERE state IN ('available', 'running') AND schedule = ANY(%(s)s::text[])
        UNION
        SELECT DISTINCT schedule FROM outbox
        WHERE state = 'published' AND finished_at IS NULL AND schedule = ANY(%(s)s::text[])
          AND published_at + make_interval(secs => timeout_seconds) > now()
        """,
        {"s": list(schedules)},
    )
    return {r[0] for r in rows}


def outbox_insert_manual(
    conn: sa.Connection | psycopg.Connection, *, key: str, schedule: str,
    scheduled_for: datetime, version_id: int, run_after: datetime, job: JobColumns,
) -> int:
    """A manual job (``trigger``): an outbox row with no period behind it (its key is
    ``planning.manual_key``'s, never a period's), waking the workers at commit."""
    return one_row(driver(conn).execute(
        f"""
        WITH ins AS (
            INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task,
                                payload, max_attempts, run_after, timeout_seconds, backoff,
                                serial, owner)
            VALUES (%(key)s, %(schedule)s, %(at)s, %(version)s, %(task)s, %(payload)s::jsonb,
                    %(max_attempts)s, %(run_after)s, %(timeout)s, %(backoff)s::jsonb,
                    %(serial)s, %(owner)s)
            RETURNING id
        ), woke AS ({wake("ins")})
        SELECT id FROM ins, woke
        """,
        {"key": key, "schedule": schedule, "at": scheduled_for, "version": version_id,
         "task": job.task, "payload": job.payload_json, "max_attempts": job.max_attempts,
         "run_after": run_after, "timeout": job.timeout, "backoff": job.backoff_json,
         "serial": job.serial, "owner": job.owner},
    ))[0]


@dataclass(frozen=True, slots=True)
class DeadFilter:
    """Which dead letters an operator chose: by schedule, task, when they died (instants, not
    ages, so the same filter selects the same rows a minute later) or ids."""
    schedule: str | None = None
    task: str | None = None
    dead_before: datetime | None = None
    dead_after: datetime | None = None
    ids: tuple[int, ...] | None = None

    def params(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "task": self.task, "older": self.dead_before,
                "newer": self.dead_after, "ids": None if self.ids is None else list(self.ids)}


_DEAD_WHERE = """
state = 'dead'
  AND (%(schedule)s::text IS NULL OR schedule = %(schedule)s)
  AND (%(task)s::text IS NULL OR task = %(task)s)
  AND (%(older)s::timestamptz IS NULL OR finished_at <= %(older)s)
  AND (%(newer)s::timestamptz IS NULL OR finished_at >= %(newer)s)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
"""

_DEAD_LIST = f"""
SELECT id, idempotency_key, schedule, task, attempts, last_error, finished_at AS dead_at,
       payload, owner, max_attempts, scheduled_for, created_at
FROM outbox
WHERE {_DEAD_WHERE}
ORDER BY finished_at, id
LIMIT %(limit)s OFFSET %(offset)s
"""


def outbox_dead_list(conn: sa.Connection, chosen: DeadFilter, *, limit: int = 1000,
                     offset: int = 0) -> list[dict[str, Any]]:
    """The dead letters ``chosen`` selects (by schedule, task, age or id), oldest first;
    ``limit`` of them from the ``offset``-th (a page of the web's list)."""
    params = {**chosen.params(), "limit": limit, "offset": offset}
    cur = driver(conn).cursor(row_factory=dict_row)
    return cur.execute(_DEAD_LIST, params).fetchall()


_DEAD_TASKS = f"SELECT task, count(*) FROM outbox WHERE {_DEAD_WHERE} GROUP BY task ORDER BY task"


def outbox_dead_tasks(conn: sa.Connection, chosen: DeadFilter) -> dict[str, int]:
    """How many dead letters a filter selects, per task (the ``outbox_dead`` index; no row's
    text is read)."""
    return dict(driver(conn).execute(_DEAD_TASKS, chosen.params()).fetchall())


@dataclass(frozen=True, slots=True)
class DeadSelection:
    """The whole of a filter's selection, as one statement saw it: ids, count per task, and a
    digest over each row's id, attempts, dead-at instant and error."""
    ids: list[int]
    tasks: dict[str, int]
    digest: str


# One snapshot of the selection (the CTE is read once); the digest is computed in the database,
# so confirming 100,000 dead letters moves a few hundred kilobytes of ids, not their errors.
_DEAD_SELECTION = """
WITH chosen AS MATERIALIZED (
    SELECT id, task, attempts, finished_at, last_error FROM outbox WHERE {where} {lock}
)
SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{{}}') FROM chosen),
       (SELECT coalesce(json_object_agg(task, n ORDER BY task), '{{}}')
        FROM (SELECT task, count(*) AS n FROM chosen GROUP BY task) per_task),
       (SELECT md5(coalesce(string_agg(
            id || ':' || attempts || ':' || coalesce(extract(epoch FROM finished_at)::text, '')
            || ':' || md5(coalesce(last_error, '')), '|' ORDER BY id), '')) FROM chosen)
"""
_DEAD_SELECTION_READ = _DEAD_SELECTION.format(where=_DEAD_WHERE, lock="")
_DEAD_SELECTION_LOCK = _DEAD_SELECTION.format(where=_DEAD_WHERE, lock="FOR UPDATE")


def outbox_dead_selection(conn: sa.Connection, chosen: DeadFilter) -> DeadSelection:
    """What a confirmation states (read only: the web's reader role may ask)."""
    return DeadSelection(*one_row(driver(conn).execute(_DEAD_SELECTION_READ, chosen.params())))


def outbox_dead_selection_locked(conn: sa.Connection, chosen: DeadFilter) -> DeadSelection:
    """The selection again, its rows locked until the caller's transaction ends, so the replay
    or discard that follows acts on exactly these (a concurrent replay waits, or has won and
    its row is no longer selected)."""
    return DeadSelection(*one_row(driver(conn).execute(_DEAD_SELECTION_LOCK, chosen.params())))


_DEAD_REPLAY = f"""
WITH replayed AS (
    UPDATE outbox
    SET state = 'available', attempts = 0, run_after = now(), finished_at = NULL,
        leased_by = NULL, lease_expires_at = NULL
    WHERE state = 'dead' AND id = ANY(%(ids)s::bigint[])
    RETURNING id
), woke AS ({wake("replayed")})
SELECT id FROM replayed, woke
"""


def outbox_dead_replay(conn: sa.Connection, ids: list[int]) -> list[int]:
    """Dead letters back to available, due now, with a fresh attempt budget. ``last_error`` is
    kept until the next attempt ends; earlier attempts stay in ``attempts``, renumbered below
    zero first (``attempts_archive``, in the same transaction) so the fresh ones start at 1."""
    return [r[0] for r in driver(conn).execute(_DEAD_REPLAY, {"ids": ids}).fetchall()]


_DEAD_DISCARD = "DELETE FROM outbox WHERE state = 'dead' AND id = ANY(%(ids)s::bigint[]) RETURNING id"


def outbox_dead_discard(conn: sa.Connection, ids: list[int]) -> list[int]:
    """Delete dead letters for good (their attempts go with them)."""
    return [r[0] for r in driver(conn).execute(_DEAD_DISCARD, {"ids": ids}).fetchall()]


_JOB_BY_KEY = """
SELECT id, idempotency_key, schedule, scheduled_for, version_id, task, payload, state, attempts,
       max_attempts, run_after, created_at, timeout_seconds, backoff, serial, owner, leased_by,
       lease_expires_at, last_error, finished_at, published_at, published_to, target_id
FROM outbox WHERE idempotency_key = %(key)s
"""


def outbox_get_by_key(conn: sa.Connection, key: str) -> dict[str, Any] | None:
    return driver(conn).cursor(row_factory=dict_row).execute(_JOB_BY_KEY, {"key": key}).fetchone()


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


_PUBLISHED_FINISH = """
WITH done AS (
    UPDATE outbox o
    SET state = %(state)s, finished_at = now(),
        last_error = CASE WHEN %(state)s = 'dead'
                          THEN 'the target reported the task failed (' || o.published_to
                               || ' id ' || o.target_id || ')' END
    WHERE o.id = ANY(%(ids)s::bigint[]) AND o.state = 'published' AND o.finished_at IS NULL
    RETURNING o.id, o.attempts, o.state{noted_columns}
){noting}
SELECT count(*) FROM done{woke}
"""


@functools.cache
def _published_finish_sql(state: str, note: bool) -> str:
    if not note:
        return _PUBLISHED_FINISH.format(noted_columns="", noting="", woke="")
    noting = (notifications_noting_dead("done") if state == "dead"
              else notifications_noting_recovered("done"))
    return _PUBLISHED_FINISH.format(noted_columns=", " + ENDED_COLUMNS, noting=noting,
                                    woke=", dead_woke" if state == "dead" else ", recovered_woke")


def outbox_published_finish(conn: sa.Connection, *, ids: list[int], states: list[str],
                            note: bool = False) -> int:
    """Record what targets reported: ``succeeded`` or ``dead`` (the target's own failure), with
    ``finished_at``. Only jobs still ``published`` and unfinished change. One statement per
    state (each autocommits on the caller's connection), noting the dead letters or the
    recoveries with ``note`` (a schema with the notifications tables)."""
    finished = 0
    for state in ("dead", "succeeded"):
        these = sorted(i for i, s in zip(ids, states, strict=True) if s == state)
        if these:
            finished += one_row(driver(conn).execute(_published_finish_sql(state, note),
                                                     {"ids": these, "state": state}))[0]
    return finished
