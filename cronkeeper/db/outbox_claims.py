"""The outbox's lease path, which workers and relays share: claim due jobs (``FOR UPDATE SKIP
LOCKED``), or the next job of a serial schedule under its advisory lock; keep the leases of the
jobs held; reap the leases of holders that stopped. How a held job ends is
``db/outbox_endings.py``.

One function per statement, bound parameters, executed on the psycopg connection under a
SQLAlchemy transaction (the caller owns ``with engine.begin() as conn``). Arrays travel in
binary (``unnest``), so a batch of N jobs is one round trip.

The batched lease extension spells the state check ``(state = 'running') IS TRUE``: the same
test, but one the planner cannot answer from the partial index ``outbox_running_lease``. With
the plain spelling it scans that index (every running job, and every dead entry left by earlier
batches until vacuum) and hash-joins the batch, so each batch costs more as a drain goes on;
this way each job is found by primary key, as the ids in the batch say.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from cronkeeper.db.engine import driver, one_row
from cronkeeper.db.notifications import notifications_noting_dead
from cronkeeper.db.wake import wake

# payload and backoff come back as JSON text, decoded when first needed (OutboxJob.payload,
# .backoff): a batch of no-op jobs should not pay two JSON parses per job up front.
COLUMNS = (
    "o.id, o.idempotency_key, o.schedule, o.scheduled_for, o.version_id, o.task,"
    " o.payload::text AS payload_json, o.attempts, o.max_attempts, o.timeout_seconds,"
    " o.backoff::text AS backoff_json, o.serial, o.owner, o.run_after, o.created_at"
)


@dataclass(frozen=True, slots=True)
class OutboxJob:
    """A job this worker holds: ``attempt`` is the attempt number it claimed (from 1)."""

    id: int
    key: str
    schedule: str | None
    scheduled_for: datetime | None
    version_id: int | None
    task: str
    payload_json: str
    attempt: int
    max_attempts: int
    timeout: float
    backoff_json: str
    serial: bool
    owner: str | None = None
    run_after: datetime | None = None
    created_at: datetime | None = None

    @property
    def payload(self) -> Any:
        """The payload, decoded from the row's JSON on each access."""
        return {} if self.payload_json == "{}" else json.loads(self.payload_json)

    @property
    def backoff(self) -> dict[str, float]:
        return json.loads(self.backoff_json)


def _jobs(rows: list[tuple]) -> list[OutboxJob]:
    return [OutboxJob(*row) for row in rows]


# Routes (docs/relay.md): a relay claims only jobs one of its routes matches (``route_tasks`` and
# ``route_schedules``: parallel arrays of anchored regexes, NULL matching anything); a worker
# (``skip_routed``) never claims a job that a route registered in relay_routes matches.
_FILTERS = """
      AND (%(tasks)s::text[] IS NULL OR task = ANY(%(tasks)s::text[]))
      AND (%(schedules)s::text[] IS NULL OR schedule = ANY(%(schedules)s::text[]))
      AND NOT (task = ANY(%(exclude)s::text[]))
      AND (%(route_tasks)s::text[] IS NULL OR EXISTS (
            SELECT 1 FROM unnest(%(route_tasks)s::text[], %(route_schedules)s::text[]) AS r(t, s)
            WHERE (r.t IS NULL OR task ~ r.t) AND (r.s IS NULL OR coalesce(schedule, '') ~ r.s)))
      AND NOT (%(skip_routed)s AND EXISTS (
            SELECT 1 FROM relay_routes r
            WHERE (r.task_regex IS NULL OR task ~ r.task_regex)
              AND (r.schedule_regex IS NULL OR coalesce(schedule, '') ~ r.schedule_regex)))
"""


@dataclass(frozen=True, slots=True)
class Routes:
    """The route filter of a relay's claim: parallel lists of anchored regexes (None: any)."""

    tasks: tuple[str | None, ...]
    schedules: tuple[str | None, ...]


def _route_params(routes: Routes | None) -> dict[str, Any]:
    """Claims by a relay (``routes``) take only routed jobs; claims by a worker skip them."""
    if routes is None:
        return {"route_tasks": None, "route_schedules": None, "skip_routed": True}
    return {"route_tasks": list(routes.tasks), "route_schedules": list(routes.schedules),
            "skip_routed": False}


# A schedule is busy while one of its jobs runs, or was published by a relay and neither reported
# finished by its target nor past its timeout since publication (docs/relay.md).
BUSY = """(state = 'running' OR (state = 'published' AND finished_at IS NULL
            AND published_at + make_interval(secs => timeout_seconds) > now()))"""

# The lease and the attempt row, for the jobs a ``picked`` CTE selected (both claims share it).
_LEASE_PICKED = f"""), claimed AS (
    UPDATE outbox o
    SET state = 'running', attempts = o.attempts + 1, leased_by = %(worker)s,
        lease_expires_at = now() + make_interval(
            secs => coalesce(%(lease)s::float8, o.timeout_seconds + %(margin)s))
    FROM picked WHERE o.id = picked.id
    RETURNING {COLUMNS}
), recorded AS (
    INSERT INTO attempts (job_id, attempt, worker_id, started_at)
    SELECT id, attempts, %(worker)s, now() FROM claimed
)
"""

_CLAIM = f"""
WITH picked AS (
    SELECT id FROM outbox
    WHERE state = 'available' AND run_after <= now() AND NOT serial {_FILTERS}
    ORDER BY run_after, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
{_LEASE_PICKED}SELECT * FROM claimed o ORDER BY o.id
"""


def outbox_claim(
    conn: sa.Connection,
    *,
    worker_id: str,
    limit: int,
    lease_margin: float,
    tasks: list[str] | None = None,
    schedules: list[str] | None = None,
    exclude_tasks: list[str] | None = None,
    routes: Routes | None = None,
    lease: float | None = None,
) -> list[OutboxJob]:
    """Claim up to ``limit`` due, non-serial jobs (FOR UPDATE SKIP LOCKED), counting an attempt
    and recording it. The lease covers the job's timeout plus ``lease_margin`` seconds, or
    ``lease`` seconds when given (a relay's lease is its publish, not the job's run).
    ``routes`` (a relay's) claims only jobs they match; without, routed jobs are skipped."""
    params = {
        "worker": worker_id, "limit": limit, "margin": lease_margin, "tasks": tasks,
        "schedules": schedules, "exclude": exclude_tasks or [], "lease": lease,
        **_route_params(routes),
    }
    return _jobs(driver(conn).execute(_CLAIM, params, binary=True).fetchall())


_NEXT_DUE = f"""
SELECT extract(epoch FROM min(run_after) - now())::float8 FROM outbox
WHERE state = 'available' AND run_after > now() {_FILTERS}
"""


def outbox_next_due(
    conn: sa.Connection,
    *,
    tasks: list[str] | None = None,
    schedules: list[str] | None = None,
) -> float | None:
    """Seconds until the earliest available job that is not due yet (None: there is none), so
    an idle worker sleeps until then rather than a whole poll interval (index outbox_available)."""
    params = {"tasks": tasks, "schedules": schedules, "exclude": [], **_route_params(None)}
    return one_row(driver(conn).execute(_NEXT_DUE, params))[0]


_SERIAL_CANDIDATES = f"""
SELECT DISTINCT schedule FROM outbox
WHERE state = 'available' AND serial AND run_after <= now() AND schedule IS NOT NULL {_FILTERS}
LIMIT %(limit)s
"""


def outbox_serial_candidates(
    conn: sa.Connection,
    *,
    limit: int,
    tasks: list[str] | None = None,
    schedules: list[str] | None = None,
    exclude_tasks: list[str] | None = None,
    routes: Routes | None = None,
) -> list[str]:
    """Schedules with a due serial job (the index outbox_available_serial keeps this cheap)."""
    params = {"limit": limit, "tasks": tasks, "schedules": schedules,
              "exclude": exclude_tasks or [], **_route_params(routes)}
    return [r[0] for r in driver(conn).execute(_SERIAL_CANDIDATES, params).fetchall()]


_SERIAL_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"

_CLAIM_SERIAL = f"""
WITH picked AS (
    SELECT id FROM outbox
    WHERE schedule = %(schedule)s AND state = 'available' AND serial AND run_after <= now()
      AND NOT EXISTS (SELECT 1 FROM outbox r WHERE r.schedule = %(schedule)s AND {BUSY})
    ORDER BY run_after, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
{_LEASE_PICKED}SELECT * FROM claimed o
"""


def outbox_claim_serial(
    conn: sa.Connection, *, schedule: str, lock_key: int, worker_id: str, lease_margin: float,
    lease: float | None = None,
) -> OutboxJob | None:
    """Claim the next job of a serial schedule unless one of its jobs is running (or published
    and not known finished, within its timeout).

    Two statements in the caller's transaction: a transaction-level advisory lock on the
    schedule first, so the NOT EXISTS check that follows runs on a snapshot taken after every
    earlier claimer of this schedule committed; nobody else claims it until we commit.
    """
    pg = driver(conn)
    if not one_row(pg.execute(_SERIAL_LOCK, {"key": lock_key}))[0]:
        return None
    params = {"schedule": schedule, "worker": worker_id, "margin": lease_margin, "lease": lease}
    rows = pg.execute(_CLAIM_SERIAL, params).fetchall()
    return _jobs(rows)[0] if rows else None


# SKIP LOCKED: a job another transaction holds (the recorder ending it, a handler's own
# commit) is not waited for, so a heartbeat can take part in no lock cycle whatever order the
# other statement's plan locks its rows in; FOR NO KEY UPDATE, the lock the UPDATE takes.
_LEASE_EXTEND = """
WITH mine AS (
    SELECT o.id FROM outbox o
    JOIN unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS h(id, attempt)
      ON o.id = h.id AND o.attempts = h.attempt
    WHERE (o.state = 'running') IS TRUE AND o.leased_by = %(worker)s
    ORDER BY o.id
    FOR NO KEY UPDATE OF o SKIP LOCKED
)
UPDATE outbox
SET lease_expires_at = greatest(lease_expires_at, now() + make_interval(secs => %(margin)s))
FROM mine WHERE outbox.id = mine.id
RETURNING outbox.id
"""


def outbox_lease_extend(
    conn: sa.Connection, *, worker_id: str, ids: list[int], attempts: list[int], margin: float
) -> list[int]:
    """Heartbeat: keep the leases of running jobs at least ``margin`` seconds ahead.

    Returns the ids extended; a missing id means the lease was lost (another worker may run
    it), or another transaction held the job at that instant (the recorder ending it): the
    heartbeat does not wait for it (``SKIP LOCKED``), so it never deadlocks with an ending
    whatever order the ending's plan locks rows in (physical order on a table scan: a small or
    fresh outbox). A caller takes one miss as no proof of a lost lease (``worker.supervisor``).
    """
    params = {"ids": ids, "attempts": attempts, "worker": worker_id, "margin": margin}
    return [r[0] for r in driver(conn).execute(_LEASE_EXTEND, params, binary=True).fetchall()]


_REAP = """
WITH expired AS (
    SELECT id, leased_by FROM outbox
    WHERE state = 'running' AND lease_expires_at < now()
      AND pg_postmaster_start_time() < now() - make_interval(secs => %(grace)s)
    ORDER BY lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), back AS (
    UPDATE outbox o
    SET state = CASE WHEN o.attempts >= o.max_attempts THEN 'dead' ELSE 'available' END,
        finished_at = CASE WHEN o.attempts >= o.max_attempts THEN now() END,
        run_after = now(), leased_by = NULL, lease_expires_at = NULL,
        last_error = 'lease expired: worker ' || coalesce(expired.leased_by, '?')
                     || ' stopped heartbeating during attempt ' || o.attempts
    FROM expired WHERE o.id = expired.id
    RETURNING o.id, o.attempts, o.last_error, o.state{noted_columns}
), recorded AS (
    UPDATE attempts a SET finished_at = now(), outcome = 'lease_expired', error = back.last_error
    FROM back WHERE a.job_id = back.id AND a.attempt = back.attempts AND a.finished_at IS NULL
), woke AS (""" + wake("back WHERE state = 'available'") + """){noting}
SELECT count(*) FROM back, woke{woke}
"""


@functools.cache
def _reap_sql(note: bool) -> str:
    if not note:
        return _REAP.format(noted_columns="", noting="", woke="")
    return _REAP.format(noted_columns=", o.schedule, o.task, o.owner, o.idempotency_key",
                        noting=notifications_noting_dead("back"), woke=", dead_woke")


RESTART_GRACE = 30.0  # seconds: the default lease margin


def outbox_reap_expired(conn: sa.Connection, *, limit: int = 1000,
                        restart_grace: float = RESTART_GRACE, note: bool = False) -> int:
    """Jobs whose lease expired become claimable again (or dead at the attempt cap); the lost
    attempt is recorded as ``lease_expired``. Returns how many.

    Nothing is reaped until PostgreSQL has been up for ``restart_grace`` seconds (the reaper's
    lease margin): a lease that ran out while the server was down or restarting could not be
    renewed, and its holder, alive, renews it (and records the endings it kept) within that
    margin of the server answering. The restart counts as one last heartbeat. ``note``: note
    the jobs that became dead letters (``db/notifications.py``; a schema with the notifications
    tables)."""
    params = {"limit": limit, "grace": restart_grace}
    return one_row(driver(conn).execute(_reap_sql(note), params))[0]
