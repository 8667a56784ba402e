"""Statements the leader runs on its lock session: schedule versions, period claims with their
jobs, and the facts a decision needs (paused, previous job unfinished)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from cronkeeper.db.engine import one_row
from cronkeeper.db.wake import CHANNEL_SQL, wake


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


class JobColumns(NamedTuple):
    """The outbox columns every job of one schedule version shares (all but its key, period,
    version and run_after). A claim sends each distinct one once, not once per period."""

    task: str
    payload_json: str
    max_attempts: int
    timeout: float
    backoff_json: str
    serial: bool
    owner: str | None


class ClaimGroup(NamedTuple):
    """What periods of one claim share: the instant (and its key stamp), the decision, and the
    job columns of an emitted one. A burst of 100,000 schedules due at one instant is one group:
    its JSON is parsed once per statement, and each period costs four array elements."""

    scheduled_for: datetime
    stamp: str  # the instant part of the idempotency key (docs/schedules.md): ``<schedule>@<stamp>``
    outcome: str
    reason: str | None
    job: JobColumns | None


@dataclass(slots=True)
class ClaimBatch:
    """One claim statement's periods, as its columns: each period is a schedule, its version,
    the (1-based) index of its group in ``groups``, and its run_after when jitter moves it
    (None: run_after is scheduled_for). ``groups`` may be shared by the batches of a tick: it
    only grows, and each statement sends it as it is then."""

    groups: list[ClaimGroup]
    schedule: list[str] = field(default_factory=list)
    version_id: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    run_after: list[datetime | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.schedule)


# Claimed: (schedule, scheduled_for, outcome, reason, job id or None).
Claim = tuple[str, datetime, str, str | None, int | None]


# Each group column is an array parameter read by subscript (a few groups: a short walk).
# The statement is never prepared, so each array is a constant of its plan: the JSON of the
# groups' payloads and backoffs is parsed once per statement, not once per period.
_G = {c: f"(%(g_{c})b::{t}[])[d.n]" for c, t in (
    ("scheduled_for", "timestamptz"), ("stamp", "text"), ("outcome", "text"), ("reason", "text"),
    ("task", "text"), ("max_attempts", "int4"), ("timeout", "float8"), ("serial", "bool"),
    ("owner", "text"))}
_G.update({c: f"(%(g_{c})b::text[]::jsonb[])[d.n]" for c in ("payload", "backoff")})


_CLAIM = f"""
WITH claimed AS (
    INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, term)
    SELECT d.schedule, {_G["scheduled_for"]}, d.version_id, {_G["outcome"]}, {_G["reason"]},
           %(term)b::int8
    FROM unnest(%(schedule)b::text[], %(version_id)b::int8[], %(group)b::int4[])
         AS d(schedule, version_id, n)
    ON CONFLICT (schedule, scheduled_for) DO NOTHING
    RETURNING schedule, scheduled_for, outcome, reason
), emitted AS (
    INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, payload,
                        max_attempts, run_after, timeout_seconds, backoff, serial, owner)
    SELECT d.schedule || '@' || {_G["stamp"]}, d.schedule, c.scheduled_for, d.version_id,
           {_G["task"]}, {_G["payload"]}, {_G["max_attempts"]},
           coalesce(d.run_after, c.scheduled_for), {_G["timeout"]}, {_G["backoff"]},
           {_G["serial"]}, {_G["owner"]}
    FROM unnest(%(schedule)b::text[], %(version_id)b::int8[], %(group)b::int4[],
                %(run_after)b::timestamptz[]) AS d(schedule, version_id, n, run_after)
         JOIN claimed c ON c.schedule = d.schedule AND c.scheduled_for = {_G["scheduled_for"]}
    WHERE c.outcome = 'emitted' AND {_G["task"]} IS NOT NULL
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, schedule, scheduled_for
), woke AS ({wake("emitted")})
SELECT c.schedule, c.scheduled_for, c.outcome, c.reason, e.id
FROM claimed c LEFT JOIN emitted e USING (schedule, scheduled_for) CROSS JOIN woke
"""


def periods_claim(conn: psycopg.Connection, rows: Sequence[PeriodRow], term: int) -> list[Claim]:
    """Claim each period under the unique constraint and write the job of each emitted one, in
    one statement. Periods someone already decided come back absent: no row back, no job.
    Returns (schedule, scheduled_for, outcome, reason, job id) for the periods this call
    claimed. A job's key is always ``<schedule>@<instant>`` (``idempotency_key``)."""
    if not rows:
        return []
    with _claim_send(conn, claim_batch(rows), term) as cur:
        return cur.fetchall()


def periods_claim_pipelined(
    conn: psycopg.Connection, batches: Iterable[ClaimBatch], term: int
) -> list[tuple[ClaimBatch, list[Claim]]]:
    """``periods_claim`` for each batch, pipelined: each statement goes to the server as soon
    as its batch is drawn, so the server writes one batch while the caller computes the next
    (a burst costs the slower of the two, not their sum). Returns each batch with its claims,
    read once the pipeline syncs; call it inside the tick's transaction."""
    sent = []
    with conn.pipeline():
        for batch in batches:
            if len(batch):
                sent.append((batch, _claim_send(conn, batch, term)))
    return [(batch, cur.fetchall()) for batch, cur in sent]


def periods_claim_copied(
    conn: psycopg.Connection, batches: Iterable[ClaimBatch], term: int,
    progress: Callable[[], None] | None = None,
) -> list[tuple[ClaimBatch, list[Claim]]]:
    """``periods_claim_pipelined``'s result, written by two ``COPY``s (periods, then the jobs of
    the emitted ones), which cost the server and the leader each about a quarter less per
    period than the claim statement (docs/performance.md, "third pass"): no array to bind or
    unpack, no ``ON CONFLICT`` check before each insert, no join of periods to jobs; each batch
    streams to the server as it is planned. It is the common case, a leader deciding
    periods nobody has decided, made cheap; the unique constraints still decide: a period or a
    key someone else holds fails the whole COPY, which is rolled back (to a savepoint inside
    the tick's transaction) and the same batches are claimed again by the claim statement,
    whose ``ON CONFLICT`` leaves the taken ones out. Call it inside the tick's transaction.
    ``progress`` is called as each batch of jobs goes out and before a fallback (the stall
    watchdog's heartbeat; the caller's batches report their own as they are drawn).

    A fast path beside its reference, the claim statement (``periods_claim``):
    ``tests/test_scale.py::test_a_grouped_claim_writes_each_periods_own_columns`` writes the same
    periods (COPY's escapes included) both ways and holds every row written equal; the job keys
    it writes are ``planning.idempotency_key``'s, from the same ``key_stamp``."""
    todo = iter(batches)
    sent: list[tuple[ClaimBatch, list[str]]] = []  # each batch with its names escaped
    texts = _GroupTexts(term)
    try:
        with conn.transaction(), conn.cursor() as cur:  # a savepoint: a conflict undoes both
            with cur.copy(_COPY_PERIODS) as copy:
                for batch in todo:  # each batch streams to the server as it is drawn
                    if len(batch):
                        names = _names(batch)
                        sent.append((batch, names))
                        copy.write(_period_lines(batch, names, texts.of(batch.groups)))
            jobs = sum(_emitting(batch, texts.of(batch.groups)) for batch, _ in sent)
            ids = iter(one_row(cur.execute(_NEXT_IDS, (jobs,)))[0] if jobs else ())
            claims = []
            with contextlib.ExitStack() as stack:
                jobs_copy = stack.enter_context(cur.copy(_COPY_JOBS)) if jobs else None
                for batch, names in sent:  # the server writes one batch while the next is made
                    claimed, lines = _job_lines(batch, names, texts.of(batch.groups), ids)
                    if jobs_copy is not None:
                        jobs_copy.write(lines)
                        if progress is not None:
                            progress()
                    claims.append((batch, claimed))
            if jobs:
                cur.execute(_WAKE_NOW)
    except psycopg.errors.UniqueViolation:
        if progress is not None:
            progress()
        return periods_claim_pipelined(conn, itertools.chain((b for b, _ in sent), todo), term)
    return claims


# COPY's text format: a field is its text with backslash, tab, newline and carriage return
# escaped; \N is NULL. Timestamps go as ISO 8601 with their offset.
_COPY_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_COPY_PERIODS = ("COPY periods (schedule, scheduled_for, version_id, outcome, reason, term) "
                 "FROM STDIN")
_COPY_JOBS = ("COPY outbox (id, idempotency_key, schedule, scheduled_for, version_id, run_after, "
              "task, payload, max_attempts, timeout_seconds, backoff, serial, owner) FROM STDIN")
_NEXT_IDS = "SELECT array_agg(nextval('outbox_id_seq')) FROM generate_series(1, %s)"
_WAKE_NOW = f"SELECT pg_notify({CHANNEL_SQL}, '')"


def _field(value: Any) -> str:
    if value is None:
        return "\\N"
    if value is True or value is False:
        return "t" if value else "f"
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value).translate(_COPY_ESCAPE)


class _GroupText(NamedTuple):
    instant: str  # scheduled_for as COPY text
    period_tail: str  # the period line after its version: outcome, reason, term
    job_tail: str | None  # the job line after its run_after; None: the group writes no job


class _GroupTexts:
    """Each group's COPY text, made once per claim call: a tick's batches share one growing
    list of groups (thousands when each schedule has its own task), so formatting them per
    batch would repeat the work for every batch."""

    def __init__(self, term: int) -> None:
        self.term = term
        self.by_list: dict[int, list[_GroupText]] = {}  # the lists stay alive in the batches

    def of(self, groups: list[ClaimGroup]) -> list[_GroupText]:
        texts = self.by_list.setdefault(id(groups), [])
        for g in groups[len(texts):]:
            job = "\t".join(map(_field, g.job)) + "\n" if _writes_job(g) else None  # type: ignore[arg-type]
            texts.append(_GroupText(_field(g.scheduled_for),
                                    f"\t{g.outcome}\t{_field(g.reason)}\t{self.term}\n", job))
        return texts


def _names(batch: ClaimBatch) -> list[str]:
    """The batch's schedule names escaped for COPY, in one pass over all of them (a name
    cannot hold NUL: PostgreSQL's text refuses it)."""
    return "\0".join(batch.schedule).translate(_COPY_ESCAPE).split("\0")


def _period_lines(batch: ClaimBatch, names: list[str], texts: list[_GroupText]) -> str:
    return "".join([
        f"{name}\t{texts[n - 1].instant}\t{version}{texts[n - 1].period_tail}"
        for name, version, n in zip(names, batch.version_id, batch.group, strict=True)
    ])


def _writes_job(group: ClaimGroup) -> bool:
    """The claim statement's rule: an emitted period with a task gets a job."""
    return group.outcome == "emitted" and group.job is not None and group.job.task is not None


def _emitting(batch: ClaimBatch, texts: list[_GroupText]) -> int:
    return sum(1 for n in batch.group if texts[n - 1].job_tail is not None)


def _job_lines(batch: ClaimBatch, names: list[str], texts: list[_GroupText],
               ids: Iterator[int]) -> tuple[list[Claim], str]:
    """A batch's claims, and the COPY lines of its jobs (``names``: the batch's names escaped),
    which take their ids from ``ids``."""
    groups = batch.groups
    lines: list[str] = []
    claims: list[Claim] = []
    for name, escaped, version, n, run_after in zip(
            batch.schedule, names, batch.version_id, batch.group, batch.run_after,
            strict=True):
        g, text = groups[n - 1], texts[n - 1]
        job_id = None
        if text.job_tail is not None:
            job_id = next(ids)
            at = text.instant
            lines.append(f"{job_id}\t{escaped}@{g.stamp}\t{escaped}\t{at}\t{version}\t"
                         f"{at if run_after is None else _field(run_after)}\t{text.job_tail}")
        claims.append((name, g.scheduled_for, g.outcome, g.reason, job_id))
    return claims, "".join(lines)


def group_number(group: ClaimGroup, groups: list[ClaimGroup],
                 index: dict[ClaimGroup, int]) -> int:
    """The (1-based) number of ``group`` in ``groups``, appended (and indexed) when new."""
    n = index.get(group)
    if n is None:
        groups.append(group)
        n = index[group] = len(groups)
    return n


def _job_columns(r: PeriodRow) -> JobColumns:
    """An emitted row's shared job columns (``scheduler.period_row`` fills every one)."""
    assert r.task is not None and r.payload_json is not None and r.max_attempts is not None
    assert r.timeout is not None and r.backoff_json is not None and r.serial is not None
    return JobColumns(r.task, r.payload_json, r.max_attempts, r.timeout, r.backoff_json,
                      r.serial, r.owner)


def claim_batch(rows: Iterable[PeriodRow]) -> ClaimBatch:
    """The claim columns of ``PeriodRow``s (the operator's backfill, tests), grouped."""
    groups: list[ClaimGroup] = []
    index: dict[ClaimGroup, int] = {}
    batch = ClaimBatch(groups)
    for r in rows:
        emitted = r.key is not None
        job = _job_columns(r) if emitted else None
        stamp = r.scheduled_for.strftime("%Y-%m-%dT%H:%M:%SZ")
        if emitted and r.key != f"{r.schedule}@{stamp}":
            raise ValueError(f"a period's job key is <schedule>@<instant>, not {r.key!r}")
        batch.schedule.append(r.schedule)
        batch.version_id.append(r.version_id)
        batch.group.append(group_number(
            ClaimGroup(r.scheduled_for, stamp, r.outcome, r.reason, job), groups, index))
        batch.run_after.append(None if r.run_after == r.scheduled_for else r.run_after)
    return batch


def _claim_send(conn: psycopg.Connection, batch: ClaimBatch, term: int) -> psycopg.Cursor:
    g = batch.groups
    jobs = [x.job or _NO_JOB for x in g]
    params: dict[str, Any] = {
        "g_scheduled_for": [x.scheduled_for for x in g], "g_stamp": [x.stamp for x in g],
        "g_outcome": [x.outcome for x in g], "g_reason": [x.reason for x in g],
        **dict(zip(_JOB_PARAMS, map(list, zip(*jobs, strict=True)), strict=True)),
        "schedule": batch.schedule, "version_id": batch.version_id, "group": batch.group,
        "run_after": batch.run_after, "term": term,
    }
    cur = conn.cursor()
    # Never prepared: a generic plan would parse the groups' JSON once per period, and not
    # seeing the arrays' lengths it may join the periods to their jobs by nested loop.
    cur.execute(_CLAIM, params, prepare=False)
    return cur


# The claim statement's parameter for each JobColumns field, in field order.
_JOB_PARAMS = ("g_task", "g_payload", "g_max_attempts", "g_timeout", "g_backoff", "g_serial",
               "g_owner")
_NO_JOB = JobColumns(*(None,) * len(JobColumns._fields))  # type: ignore[arg-type]


def outbox_insert_manual(conn: psycopg.Connection, row: PeriodRow) -> int:
    """A manual job (``trigger``): an outbox row with no period behind it."""
    return one_row(conn.execute(
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
    ))[0]
