"""Statements the leader runs on its lock session: schedule versions, period claims with their
jobs, and the facts a decision needs (paused, previous job unfinished)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from cronkeeper.db.wake import wake


@dataclass(frozen=True, slots=True)
class VersionRow:
    id: int
    schedule: str
    digest: str
    spec: dict[str, Any] | None
    active_from: datetime


class PeriodRow(NamedTuple):
    """One decision to record; the job fields hold the outbox columns when it is emitted.

    Immutable like the frozen dataclasses elsewhere, but a tuple: a burst builds one per
    schedule (a frozen dataclass's ``__init__`` costs several times more), and ``zip(*rows)``
    turns a batch into the statement's columns at C speed. Fields in the statement's order."""

    schedule: str
    scheduled_for: datetime
    version_id: int
    outcome: str
    reason: str | None
    key: str | None = None
    task: str | None = None
    payload_json: str | None = None
    max_attempts: int | None = None
    run_after: datetime | None = None
    timeout: float | None = None
    backoff_json: str | None = None
    serial: bool | None = None
    owner: str | None = None


def db_now(conn: psycopg.Connection) -> datetime:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def versions_in_force(conn: psycopg.Connection) -> list[VersionRow]:
    """The newest version of every schedule ever seen (spec None: removed)."""
    rows = conn.execute(
        """
        SELECT DISTINCT ON (schedule) id, schedule, digest, spec, active_from
        FROM schedule_versions ORDER BY schedule, active_from DESC, id DESC
        """
    ).fetchall()
    return [VersionRow(*r) for r in rows]


def versions_insert(
    conn: psycopg.Connection,
    rows: Sequence[tuple[str, str, dict[str, Any] | str | None]],
    active_from: datetime,
    term: int,
) -> dict[str, int]:
    """Record new versions (schedule, digest, spec or None for removal); return their ids.
    A spec is a dict or its JSON text."""
    if not rows:
        return {}
    result = conn.execute(
        """
        INSERT INTO schedule_versions (schedule, digest, spec, active_from, term)
        SELECT s, d, j::jsonb, %(at)s, %(term)s
        FROM unnest(%(s)b::text[], %(d)b::text[], %(j)b::text[]) AS v(s, d, j)
        ON CONFLICT (schedule, active_from) DO NOTHING
        RETURNING schedule, id
        """,
        {
            "s": [r[0] for r in rows],
            "d": [r[1] for r in rows],
            "j": [r[2] if r[2] is None or isinstance(r[2], str) else json.dumps(r[2])
                  for r in rows],
            "at": active_from,
            "term": term,
        },
    ).fetchall()
    return dict(result)


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


def controls_paused(conn: psycopg.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT schedule FROM schedule_controls WHERE paused")}


def outbox_unfinished(conn: psycopg.Connection, schedules: Sequence[str]) -> set[str]:
    """Schedules whose previous job is not finished: waiting, running, or waiting to retry; or
    published by a relay and neither reported finished nor past its timeout since publication
    (SPEC §11). Two arms, so each is answered from its partial index."""
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


_CLAIM = """
WITH decided AS (
    SELECT * FROM unnest(%(schedule)b::text[], %(scheduled_for)b::timestamptz[],
                         %(version_id)b::int8[], %(outcome)b::text[], %(reason)b::text[])
           AS d(schedule, scheduled_for, version_id, outcome, reason)
), claimed AS (
    INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, term)
    SELECT schedule, scheduled_for, version_id, outcome, reason, %(term)b::int8 FROM decided
    ON CONFLICT (schedule, scheduled_for) DO NOTHING
    RETURNING schedule, scheduled_for, outcome
), jobs AS (
    SELECT * FROM unnest(%(key)b::text[], %(schedule)b::text[], %(scheduled_for)b::timestamptz[],
                         %(version_id)b::int8[], %(task)b::text[], %(payload)b::text[],
                         %(max_attempts)b::int4[], %(run_after)b::timestamptz[],
                         %(timeout)b::float8[], %(backoff)b::text[], %(serial)b::bool[],
                         %(owner)b::text[])
           AS j(key, schedule, scheduled_for, version_id, task, payload, max_attempts, run_after,
                timeout, backoff, serial, owner)
), emitted AS (
    INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, payload,
                        max_attempts, run_after, timeout_seconds, backoff, serial, owner)
    SELECT j.key, j.schedule, j.scheduled_for, j.version_id, j.task, j.payload::jsonb,
           j.max_attempts, j.run_after, j.timeout, j.backoff::jsonb, j.serial, j.owner
    FROM jobs j JOIN claimed c USING (schedule, scheduled_for)
    WHERE c.outcome = 'emitted' AND j.key IS NOT NULL
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, schedule, scheduled_for
), woke AS (""" + wake("emitted") + """)
SELECT c.schedule, c.scheduled_for, c.outcome, e.id
FROM claimed c LEFT JOIN emitted e USING (schedule, scheduled_for) CROSS JOIN woke
"""


def periods_claim(
    conn: psycopg.Connection, rows: Sequence[PeriodRow], term: int
) -> list[tuple[str, datetime, str, int | None]]:
    """Claim each period under the unique constraint and write the job of each emitted one, in
    one statement. Periods someone already decided come back absent: no row back, no job.
    Returns (schedule, scheduled_for, outcome, job id) for the periods this call claimed."""
    if not rows:
        return []
    with _claim_send(conn, rows, term) as cur:
        return cur.fetchall()


def periods_claim_pipelined(
    conn: psycopg.Connection, batches: Iterable[Sequence[PeriodRow]], term: int
) -> list[tuple[Sequence[PeriodRow], list[tuple[str, datetime, str, int | None]]]]:
    """``periods_claim`` for each batch, pipelined: each statement goes to the server as soon
    as its batch is drawn, so the server writes one batch while the caller computes the next
    (a burst of 10,000 periods costs the slower of the two, not their sum). Returns each batch
    with its claims, read once the pipeline syncs; call it inside the tick's transaction."""
    sent = []
    with conn.pipeline():
        for rows in batches:
            if rows:
                sent.append((rows, _claim_send(conn, rows, term)))
    return [(rows, cur.fetchall()) for rows, cur in sent]


# The claim statement's parameter for each PeriodRow field, in field order.
_CLAIM_PARAMS = ("schedule", "scheduled_for", "version_id", "outcome", "reason", "key", "task",
                 "payload", "max_attempts", "run_after", "timeout", "backoff", "serial", "owner")


def _claim_send(conn: psycopg.Connection, rows: Sequence[PeriodRow], term: int) -> psycopg.Cursor:
    cols: dict[str, Any] = dict(zip(_CLAIM_PARAMS, map(list, zip(*rows, strict=True)), strict=True))
    cols["term"] = term  # type: ignore[assignment]
    cur = conn.cursor()
    cur.execute(_CLAIM, cols)
    return cur


def versions_history(conn: psycopg.Connection, schedule: str) -> list[VersionRow]:
    """Every version of one schedule, oldest first."""
    rows = conn.execute(
        """
        SELECT id, schedule, digest, spec, active_from FROM schedule_versions
        WHERE schedule = %s ORDER BY active_from, id
        """,
        (schedule,),
    ).fetchall()
    return [VersionRow(*r) for r in rows]


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


def controls_set(conn: psycopg.Connection, schedule: str, paused: bool, changed_by: str) -> None:
    conn.execute(
        """
        INSERT INTO schedule_controls (schedule, paused, changed_by) VALUES (%s, %s, %s)
        ON CONFLICT (schedule) DO UPDATE
           SET paused = excluded.paused, changed_at = clock_timestamp(),
               changed_by = excluded.changed_by
        """,
        (schedule, paused, changed_by),
    )


def outbox_insert_manual(conn: psycopg.Connection, row: PeriodRow) -> int:
    """A manual job (``trigger``): an outbox row with no period behind it."""
    return conn.execute(
        """
        WITH ins AS (
            INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task,
                                payload, max_attempts, run_after, timeout_seconds, backoff,
                                serial, owner)
            VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s::jsonb, %s, %s)
            RETURNING id
        ), woke AS (""" + wake("ins") + """)
        SELECT id FROM ins, woke
        """,
        (row.key, row.schedule, row.scheduled_for, row.version_id, row.task, row.payload_json,
         row.max_attempts, row.run_after, row.timeout, row.backoff_json, row.serial, row.owner),
    ).fetchone()[0]
