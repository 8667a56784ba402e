"""The claim: a period is decided by inserting it under the ``periods`` primary key, and an
emitted one's job is written to the outbox in the same transaction. No row back, no job: a
period someone already decided (another leader, a backfill) comes back absent.

``periods_claim`` is the one way in, for the leader's tick and an operator's backfill alike.
It writes by ``COPY`` first (``_periods_claim_copy``, a fast path) and falls back to the claim
statement (``_periods_claim_statement``, the readable reference) when a period or a key is
taken. ``tests/test_scale.py::test_a_grouped_claim_writes_each_periods_own_columns`` writes the
same periods both ways and holds every row written equal; ``tests/test_daemon_split_brain.py``
claims from two connections at once both ways; ``tests/test_wake_notify.py`` checks that both
wake the workers once, at commit.

What travels, from the caller to the statement:

- ``JobColumns``: the outbox columns every job of one schedule version shares (all but its key,
  period, version and run_after), built once per version;
- ``ClaimGroup``: what periods of one claim share: the instant, the decision, and for an emitted
  one its ``JobColumns``. A burst of 100,000 schedules due at one instant is one group;
- ``ClaimBatch``: one statement's periods as columns (schedule, version, group number,
  run_after), beside the groups they point to; the batches of a tick share one list of groups;
- ``Claim``: what comes back for each period this call claimed.

A job's key is always ``<schedule>@<instant>``, the instant from ``planning.key_stamp``
(``planning.idempotency_key`` makes the same key; the tests above hold the two equal).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from cronkeeper.db.engine import one_row
from cronkeeper.db.wake import CHANNEL_SQL, wake
from cronkeeper.planning import key_stamp


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
    """What periods of one claim share: the instant, the decision (outcome and reason), and the
    job columns of an emitted one (None: the period writes no job). Its JSON is parsed once per
    statement, and each period of the group costs four array elements."""

    scheduled_for: datetime
    outcome: str
    reason: str | None
    job: JobColumns | None


@dataclass(slots=True)
class ClaimBatch:
    """One claim statement's periods, as its columns: each period is a schedule, its version,
    the (1-based) number of its group in ``groups``, and its run_after when jitter moves it
    (None: run_after is scheduled_for). ``groups`` (and ``numbers``, each group's number) may
    be shared by the batches of a tick (``following``): they only grow, and each statement
    sends the groups as they are then."""

    groups: list[ClaimGroup] = field(default_factory=list)
    numbers: dict[ClaimGroup, int] = field(default_factory=dict)
    schedule: list[str] = field(default_factory=list)
    version_id: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    run_after: list[datetime | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.schedule)

    def number(self, group: ClaimGroup) -> int:
        """The number of ``group`` in ``groups``, appended when new."""
        n = self.numbers.get(group)
        if n is None:
            self.groups.append(group)
            n = self.numbers[group] = len(self.groups)
        return n

    def add(self, schedule: str, version_id: int, group: ClaimGroup,
            run_after: datetime | None = None) -> None:
        """One period (the tick appends to the columns itself: a burst's hot path)."""
        self.schedule.append(schedule)
        self.version_id.append(version_id)
        self.group.append(self.number(group))
        self.run_after.append(None if run_after == group.scheduled_for else run_after)

    def following(self) -> ClaimBatch:
        """The next batch, empty, sharing this one's groups."""
        return ClaimBatch(self.groups, self.numbers)


# Claimed: (schedule, scheduled_for, outcome, reason, job id or None).
Claim = tuple[str, datetime, str, str | None, int | None]


def periods_claim(
    conn: psycopg.Connection, batches: Iterable[ClaimBatch], term: int,
    progress: Callable[[], None] | None = None,
) -> list[tuple[ClaimBatch, list[Claim]]]:
    """Claim each batch's periods under the unique constraint and write the job of each emitted
    one; return each batch with the periods this call claimed (term 0: an operator's). Call it
    inside a transaction (the tick's, the backfill's): a period or key someone else holds
    undoes the COPY to a savepoint, and the batches drawn so far, then the rest, are claimed
    again by the claim statement, whose ``ON CONFLICT`` leaves the taken ones out. Batches are
    drawn lazily, each sent as it comes (the caller plans the next while the server writes).
    ``progress`` is called as each batch of jobs goes out and before a fallback (the stall
    watchdog's heartbeat)."""
    drawn: list[ClaimBatch] = []
    todo = iter(batches)
    try:
        return _periods_claim_copy(conn, todo, drawn, term, progress)
    except psycopg.errors.UniqueViolation:
        if progress is not None:
            progress()
        return _periods_claim_statement(conn, itertools.chain(drawn, todo), term)


# -- the reference: one statement per batch ----------------------------------------------------
# Each group column is an array parameter read by subscript (a few groups: a short walk). The
# statement is never prepared, so each array is a constant of its plan: the JSON of the groups'
# payloads and backoffs is parsed once per statement, not once per period.
_CLAIM = f"""
WITH claimed AS (
    INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, term)
    SELECT d.schedule, (%(g_scheduled_for)b::timestamptz[])[d.n], d.version_id,
           (%(g_outcome)b::text[])[d.n], (%(g_reason)b::text[])[d.n], %(term)b::int8
    FROM unnest(%(schedule)b::text[], %(version_id)b::int8[], %(group)b::int4[])
         AS d(schedule, version_id, n)
    ON CONFLICT (schedule, scheduled_for) DO NOTHING
    RETURNING schedule, scheduled_for, outcome, reason
), emitted AS (
    INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, payload,
                        max_attempts, run_after, timeout_seconds, backoff, serial, owner)
    SELECT d.schedule || '@' || (%(g_stamp)b::text[])[d.n], d.schedule, c.scheduled_for,
           d.version_id, (%(g_task)b::text[])[d.n], (%(g_payload)b::text[]::jsonb[])[d.n],
           (%(g_max_attempts)b::int4[])[d.n], coalesce(d.run_after, c.scheduled_for),
           (%(g_timeout)b::float8[])[d.n], (%(g_backoff)b::text[]::jsonb[])[d.n],
           (%(g_serial)b::bool[])[d.n], (%(g_owner)b::text[])[d.n]
    FROM unnest(%(schedule)b::text[], %(version_id)b::int8[], %(group)b::int4[],
                %(run_after)b::timestamptz[]) AS d(schedule, version_id, n, run_after)
         JOIN claimed c ON c.schedule = d.schedule
                       AND c.scheduled_for = (%(g_scheduled_for)b::timestamptz[])[d.n]
    WHERE c.outcome = 'emitted' AND (%(g_task)b::text[])[d.n] IS NOT NULL
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id, schedule, scheduled_for
), woke AS ({wake("emitted")})
SELECT c.schedule, c.scheduled_for, c.outcome, c.reason, e.id
FROM claimed c LEFT JOIN emitted e USING (schedule, scheduled_for) CROSS JOIN woke
"""

# The claim statement's parameter for each JobColumns field, in field order.
_JOB_PARAMS = ("g_task", "g_payload", "g_max_attempts", "g_timeout", "g_backoff", "g_serial",
               "g_owner")
_NO_JOB = JobColumns(*(None,) * len(JobColumns._fields))  # type: ignore[arg-type]


def _periods_claim_statement(
    conn: psycopg.Connection, batches: Iterable[ClaimBatch], term: int
) -> list[tuple[ClaimBatch, list[Claim]]]:
    """The reference: the claim statement for each batch, pipelined (each statement goes to the
    server as soon as its batch is drawn, so the server writes one batch while the caller
    computes the next). Claims come back as read, in the session's time zone."""
    sent = []
    with conn.pipeline():
        for batch in batches:
            if len(batch):
                sent.append((batch, _claim_send(conn, batch, term)))
    return [(batch, cur.fetchall()) for batch, cur in sent]


def _claim_send(conn: psycopg.Connection, batch: ClaimBatch, term: int) -> psycopg.Cursor:
    g = batch.groups
    jobs = [x.job or _NO_JOB for x in g]
    params: dict[str, Any] = {
        "g_scheduled_for": [x.scheduled_for for x in g],
        "g_stamp": [key_stamp(x.scheduled_for) for x in g],
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


# -- the fast path: two COPYs ----------------------------------------------------------------
_COPY_PERIODS = """
COPY periods (schedule, scheduled_for, version_id, outcome, reason, term) FROM STDIN
"""
_COPY_JOBS = """
COPY outbox (id, idempotency_key, schedule, scheduled_for, version_id, run_after, task, payload,
             max_attempts, timeout_seconds, backoff, serial, owner) FROM STDIN
"""
_NEXT_IDS = "SELECT array_agg(nextval('outbox_id_seq')) FROM generate_series(1, %(n)s)"
_WAKE_NOW = f"SELECT pg_notify({CHANNEL_SQL}, '')"


def _periods_claim_copy(
    conn: psycopg.Connection, batches: Iterator[ClaimBatch], drawn: list[ClaimBatch], term: int,
    progress: Callable[[], None] | None,
) -> list[tuple[ClaimBatch, list[Claim]]]:
    """A fast path beside the claim statement (``_periods_claim_statement``, the reference):
    the same rows, written by two ``COPY``s (periods, then the jobs of the emitted ones), which
    cost the server and the leader each about a quarter less per period than the statement
    (docs/performance.md, "third pass"): no array to bind or unpack, no ``ON CONFLICT`` check
    before each insert, no join of periods to jobs; each batch streams to the server as it is
    drawn (and is appended to ``drawn``). It is the common case, a leader deciding periods
    nobody has decided, made cheap; the unique constraints still decide: a period or a key
    someone else holds fails the whole COPY with ``UniqueViolation``, undone to the savepoint
    taken here (``periods_claim`` then falls back). Claims come back with their instants as
    planned. ``tests/test_scale.py::test_a_grouped_claim_writes_each_periods_own_columns``
    holds every row it writes equal to the statement's, COPY's escapes included. The text is
    built by hand, each group's share once, rather than by psycopg's ``Copy.write_row``, which
    doubled the leader's CPU for a burst (docs/performance.md, "COPY text by hand")."""
    texts = _GroupTexts(term)
    escaped: list[list[str]] = []  # each drawn batch's names, escaped for COPY
    with conn.transaction(), conn.cursor() as cur:  # a savepoint: a conflict undoes both
        with cur.copy(_COPY_PERIODS) as copy:
            for batch in batches:  # each batch streams to the server as it is drawn
                if len(batch):
                    names = _names(batch)
                    drawn.append(batch)
                    escaped.append(names)
                    copy.write(_period_lines(batch, names, texts.of(batch.groups)))
        jobs = sum(_emitting(batch, texts.of(batch.groups)) for batch in drawn)
        ids = iter(one_row(cur.execute(_NEXT_IDS, {"n": jobs}))[0] if jobs else ())
        claims = []
        with contextlib.ExitStack() as stack:
            jobs_copy = stack.enter_context(cur.copy(_COPY_JOBS)) if jobs else None
            for batch, names in zip(drawn, escaped, strict=True):  # one batch written, the next made
                claimed, lines = _job_lines(batch, names, texts.of(batch.groups), ids)
                if jobs_copy is not None:
                    jobs_copy.write(lines)
                    if progress is not None:
                        progress()
                claims.append((batch, claimed))
        if jobs:
            cur.execute(_WAKE_NOW)
    return claims


# COPY's text format: a field is its text with backslash, tab, newline and carriage return
# escaped; \N is NULL. Timestamps go as ISO 8601 with their offset.
_COPY_ESCAPE = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


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
    stamp: str  # the instant part of the job key (``planning.key_stamp``)
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
            texts.append(_GroupText(_field(g.scheduled_for), key_stamp(g.scheduled_for),
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
            lines.append(f"{job_id}\t{escaped}@{text.stamp}\t{escaped}\t{at}\t{version}\t"
                         f"{at if run_after is None else _field(run_after)}\t{text.job_tail}")
        claims.append((name, g.scheduled_for, g.outcome, g.reason, job_id))
    return claims, "".join(lines)
