"""The ``notifications`` table (migrations/0013; docs/notifications.md): what a person is told.

Two halves:

- *Noting*, in the transaction of the event itself. ``notifications_noting_dead`` and
  ``notifications_noting_recovered`` are CTE fragments that the statements which dead-letter a
  job or complete one (``db/outbox_endings.py``, ``db/outbox_claims.py``'s reaper,
  ``db/outbox.py``'s relay completions) append to themselves, the way they append ``wake``: the
  notification, and the per-schedule state that keeps a flood to one message
  (``notification_subjects``), commit or roll back with the event. The leader notes ``missed``
  periods in the tick's transaction (``notifications_note_missed``) and ``missing`` ones in its
  audit's (``notifications_note_missing``).
- *Sending*, afterwards: a sender claims one due notification (``FOR UPDATE SKIP LOCKED``, a
  lease), records each sink as it answers (``notifications_delivered``, which also renews the
  lease; ``notifications_renew`` after a sink that may take it on a later try), and settles it
  (``notifications_settle``: sent, failed, or back to pending after a backoff);
  ``notifications_reap_expired`` hands back the ones whose sender stopped.

Row locks on ``notification_subjects`` are always taken in (kind, name) order (an ``INSERT ...
SELECT ... ORDER BY``, a ``SELECT ... ORDER BY ... FOR UPDATE``), so two workers ending jobs of
the same schedules in different orders never deadlock on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cronkeeper.db.engine import driver, one_row
from cronkeeper.db.wake import NOTES_CHANNEL_SQL, wake

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa

# The subject of a job: its schedule, or its task when it has none (enqueued jobs).
_SUBJECT = ("CASE WHEN schedule IS NULL THEN 'task' ELSE 'schedule' END AS kind, "
            "coalesce(schedule, task) AS name")

# What a statement's ended jobs must carry for noting, besides id, attempts and state (its
# RETURNING, on the outbox row).
ENDED_COLUMNS = "o.schedule, o.task, o.owner, o.idempotency_key, o.last_error"


def notifications_noting_dead(ended: str) -> str:
    """CTEs (each starting with a comma) that, for the jobs of CTE ``ended`` now ``dead``
    (columns: id, attempts, state and ``ENDED_COLUMNS``), count each dead letter against its subject and write one
    ``dead`` notification per subject that was not already dead (the first dead letter of the
    statement's); the others are counted (``dead_letters``, ``suppressed_total``). Ends with
    ``dead_woke``, which the statement's final SELECT must join (it wakes the senders)."""
    return f"""
, dead_ended AS (
    SELECT id, schedule, task, owner, idempotency_key, attempts, last_error, {_SUBJECT}
    FROM {ended} WHERE state = 'dead'
), dead_groups AS (
    SELECT kind, name, count(*)::int AS n, min(id) AS first_id FROM dead_ended GROUP BY kind, name
), dead_counted AS (
    INSERT INTO notification_subjects AS s (kind, name, dead_letters, dead_since, suppressed_total)
    SELECT kind, name, n, now(), n - 1 FROM dead_groups ORDER BY kind, name
    ON CONFLICT (kind, name) DO UPDATE
    SET dead_letters = s.dead_letters + EXCLUDED.dead_letters,
        dead_since = CASE WHEN s.dead_letters = 0 THEN EXCLUDED.dead_since ELSE s.dead_since END,
        suppressed_total = s.suppressed_total + EXCLUDED.dead_letters
                           - CASE WHEN s.dead_letters = 0 THEN 1 ELSE 0 END
    RETURNING s.kind, s.name, s.dead_letters
), dead_noted AS (
    INSERT INTO notifications (event, schedule, task, owner, job_id, key, attempts, error)
    SELECT 'dead', e.schedule, e.task, e.owner, e.id, e.idempotency_key, e.attempts, e.last_error
    FROM dead_counted c JOIN dead_groups g ON g.kind = c.kind AND g.name = c.name
         JOIN dead_ended e ON e.id = g.first_id
    WHERE c.dead_letters = g.n
    RETURNING id
), dead_woke AS ({wake("dead_noted", NOTES_CHANNEL_SQL)})"""


def notifications_noting_recovered(ended: str) -> str:
    """CTEs (each starting with a comma) that, for the jobs of CTE ``ended`` now
    ``succeeded``, end the dead state of their subjects (locked in order) and write one
    ``recovered`` notification per subject that was dead, carrying the count of dead letters
    not sent meanwhile and the window since the first. Ends with ``recovered_woke``."""
    return f"""
, ok_ended AS (
    SELECT id, schedule, task, owner, idempotency_key, attempts, {_SUBJECT}
    FROM {ended} WHERE state = 'succeeded'
), recovering AS (
    SELECT s.kind, s.name, s.dead_letters, s.dead_since FROM notification_subjects s
    WHERE s.dead_letters > 0 AND (s.kind, s.name) IN (SELECT kind, name FROM ok_ended)
    ORDER BY s.kind, s.name
    FOR UPDATE
), recovered AS (
    UPDATE notification_subjects s SET dead_letters = 0, dead_since = NULL
    FROM recovering r WHERE s.kind = r.kind AND s.name = r.name
    RETURNING s.kind, s.name
), recovered_noted AS (
    INSERT INTO notifications (event, schedule, task, owner, job_id, key, attempts, count,
                               window_from, window_until)
    SELECT DISTINCT ON (r.kind, r.name) 'recovered', e.schedule, e.task, e.owner, e.id,
           e.idempotency_key, e.attempts, r.dead_letters - 1, r.dead_since, now()
    FROM recovering r JOIN recovered u ON u.kind = r.kind AND u.name = r.name
         JOIN ok_ended e ON e.kind = r.kind AND e.name = r.name
    ORDER BY r.kind, r.name, e.id
    RETURNING id
), recovered_woke AS ({wake("recovered_noted", NOTES_CHANNEL_SQL)})"""


# -- the leader's events ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Skipped:
    """Periods of one schedule decided as skipped for want of a leader in time (misfire,
    coalesced) in one transaction, or found missing by the audit: how many, and their window."""

    schedule: str
    task: str | None
    owner: str | None
    count: int
    first: datetime
    last: datetime


def _skipped_params(rows: list[Skipped]) -> dict[str, Any]:
    return {"schedules": [r.schedule for r in rows], "tasks": [r.task for r in rows],
            "owners": [r.owner for r in rows], "counts": [r.count for r in rows],
            "firsts": [r.first for r in rows], "lasts": [r.last for r in rows]}


# The skipped (or missing) periods of each schedule, as the CTE ``m`` both statements begin with.
_SKIPPED = """
WITH m AS (
    SELECT * FROM unnest(%(schedules)s::text[], %(tasks)s::text[], %(owners)s::text[],
                         %(counts)s::int[], %(firsts)s::timestamptz[], %(lasts)s::timestamptz[])
             AS m(schedule, task, owner, count, first, last)
)"""

# A missed notification waits this long before it is sent: the periods of one outage that a
# new leader decides over several ticks (a long outage is worked off 5,000 periods a tick) are
# added to it meanwhile, so the outage is told once.
MISSED_SETTLE = 5.0

_NOTE_MISSED = _SKIPPED + """, target AS (
    SELECT n.id, n.schedule FROM notifications n
    WHERE n.id IN (SELECT max(w.id) FROM notifications w JOIN m USING (schedule)
                   WHERE w.event = 'missed' AND w.state = 'pending' AND w.tries = 0
                   GROUP BY w.schedule)
      AND n.state = 'pending' AND n.tries = 0
    FOR UPDATE SKIP LOCKED
), merged AS (
    UPDATE notifications n
    SET count = n.count + m.count, window_from = least(n.window_from, m.first),
        window_until = greatest(n.window_until, m.last)
    FROM target t JOIN m USING (schedule) WHERE n.id = t.id
    RETURNING n.id
), added AS (
    INSERT INTO notifications (event, schedule, task, owner, count, window_from, window_until,
                               run_after)
    SELECT 'missed', m.schedule, m.task, m.owner, m.count, m.first, m.last,
           now() + make_interval(secs => %(settle)s)
    FROM m WHERE m.schedule NOT IN (SELECT schedule FROM target)
    RETURNING id
)
SELECT (SELECT count(*) FROM merged), (SELECT count(*) FROM added)
"""


def notifications_note_missed(conn: sa.Connection | Any, rows: list[Skipped]) -> tuple[int, int]:
    """In the tick's transaction: one ``missed`` notification per schedule, added to one of the
    same schedule still waiting to be sent (never tried) when there is one. Returns (merged,
    added). The senders are not woken: the notification waits ``MISSED_SETTLE`` seconds."""
    params = {**_skipped_params(rows), "settle": MISSED_SETTLE}
    merged, added = one_row(driver(conn).execute(_NOTE_MISSED, params))
    return int(merged), int(added)


_NOTE_MISSING = _SKIPPED + """, known AS (
    SELECT s.name, s.missing_through FROM notification_subjects s JOIN m ON s.name = m.schedule
    WHERE s.kind = 'schedule'
    ORDER BY s.name
    FOR UPDATE OF s
), fresh AS (
    SELECT m.* FROM m LEFT JOIN known k ON k.name = m.schedule
    WHERE k.missing_through IS NULL OR m.last > k.missing_through
), through AS (
    INSERT INTO notification_subjects AS s (kind, name, missing_through)
    SELECT 'schedule', schedule, last FROM fresh ORDER BY schedule
    ON CONFLICT (kind, name) DO UPDATE
    SET missing_through = greatest(s.missing_through, EXCLUDED.missing_through)
), noted AS (
    INSERT INTO notifications (event, schedule, task, owner, count, window_from, window_until)
    SELECT 'missing', schedule, task, owner, count, first, last FROM fresh
    RETURNING id
), woke AS (""" + wake("noted", NOTES_CHANNEL_SQL) + """)
SELECT count(*) FROM noted, woke
"""


def notifications_note_missing(conn: sa.Connection | Any, rows: list[Skipped]) -> int:
    """In the leader's audit transaction: one ``missing`` notification per schedule with
    missing periods later than the last it was told about (``missing_through``; the caller
    passes only the periods it found newly missing). Returns how many were written."""
    return int(one_row(driver(conn).execute(_NOTE_MISSING, _skipped_params(rows)))[0])


# -- sending ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Note:
    """A notification a sender holds: ``tries`` is the try it claimed (from 1)."""

    id: int
    event: str
    schedule: str | None
    task: str | None
    owner: str | None
    job_id: int | None
    key: str | None
    attempts: int | None
    error: str | None
    count: int
    window_from: datetime | None
    window_until: datetime | None
    created_at: datetime
    tries: int
    sent_to: tuple[str, ...]
    failed_to: tuple[str, ...]
    age: float  # seconds since it was written (the database's clock)


_CLAIM = """
WITH picked AS (
    SELECT id FROM notifications
    WHERE state = 'pending' AND run_after <= now()
    ORDER BY run_after, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE notifications n
SET state = 'sending', tries = n.tries + 1, leased_by = %(sender)s,
    lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM picked WHERE n.id = picked.id
RETURNING n.id, n.event, n.schedule, n.task, n.owner, n.job_id, n.key, n.attempts, n.error,
          n.count, n.window_from, n.window_until, n.created_at, n.tries, n.sent_to, n.failed_to,
          extract(epoch FROM now() - n.created_at)::float8
"""


def notifications_claim(conn: sa.Connection, *, sender: str, lease: float) -> Note | None:
    """Claim the oldest due notification (FOR UPDATE SKIP LOCKED), counting a try, under a
    lease of ``lease`` seconds; None when none is due."""
    row = driver(conn).execute(_CLAIM, {"sender": sender, "lease": lease}).fetchone()
    if row is None:
        return None
    values = list(row)
    values[14], values[15] = tuple(values[14] or ()), tuple(values[15] or ())
    return Note(*values)


_NEXT_DUE = """
SELECT extract(epoch FROM min(run_after) - now())::float8 FROM notifications
WHERE state = 'pending'
"""


def notifications_next_due(conn: sa.Connection) -> float | None:
    """Seconds until the earliest pending notification is due (negative: overdue; None: none)."""
    return one_row(driver(conn).execute(_NEXT_DUE))[0]


_DELIVERED = """
UPDATE notifications
SET sent_to = CASE WHEN %(ok)s THEN array_append(sent_to, %(sink)s) ELSE sent_to END,
    failed_to = CASE WHEN %(ok)s THEN failed_to ELSE array_append(failed_to, %(sink)s) END,
    lease_expires_at = now() + make_interval(secs => %(lease)s)
WHERE id = %(id)s AND tries = %(tries)s AND state = 'sending' AND leased_by = %(sender)s
RETURNING id
"""


def notifications_delivered(conn: sa.Connection, *, note_id: int, tries: int, sender: str,
                            sink: str, ok: bool, lease: float) -> bool:
    """Record that ``sink`` took the notification (``ok``) or refused it for good, and renew
    the lease for the next sink (fenced: False when the lease was lost meanwhile)."""
    params = {"id": note_id, "tries": tries, "sender": sender, "sink": sink, "ok": ok,
              "lease": lease}
    return driver(conn).execute(_DELIVERED, params).fetchone() is not None


_RENEW = """
UPDATE notifications SET lease_expires_at = now() + make_interval(secs => %(lease)s)
WHERE id = %(id)s AND tries = %(tries)s AND state = 'sending' AND leased_by = %(sender)s
RETURNING id
"""


def notifications_renew(conn: sa.Connection, *, note_id: int, tries: int, sender: str,
                        lease: float) -> bool:
    """Renew the lease for the next sink after one that failed but may take it on a later try
    (fenced: False when the lease was lost meanwhile)."""
    params = {"id": note_id, "tries": tries, "sender": sender, "lease": lease}
    return driver(conn).execute(_RENEW, params).fetchone() is not None


_SETTLE = """
UPDATE notifications
SET state = %(state)s, leased_by = NULL, lease_expires_at = NULL, last_error = %(error)s,
    run_after = CASE WHEN %(state)s = 'pending'
                     THEN now() + make_interval(secs => %(delay)s) ELSE run_after END,
    finished_at = CASE WHEN %(state)s = 'pending' THEN NULL ELSE now() END
WHERE id = %(id)s AND tries = %(tries)s AND state = 'sending' AND leased_by = %(sender)s
RETURNING extract(epoch FROM now() - created_at)::float8
"""


def notifications_settle(conn: sa.Connection, *, note_id: int, tries: int, sender: str,
                         state: str, delay: float = 0.0, error: str | None = None) -> float | None:
    """End a try: ``sent``, ``failed`` (for good), or ``pending`` again after ``delay`` seconds
    (fenced). Returns the seconds since the notification was written (None: lease lost)."""
    params = {"id": note_id, "tries": tries, "sender": sender, "state": state, "delay": delay,
              "error": error}
    row = driver(conn).execute(_SETTLE, params).fetchone()
    return None if row is None else float(row[0])


_REAP = """
UPDATE notifications
SET state = 'pending', run_after = now(), leased_by = NULL, lease_expires_at = NULL,
    last_error = 'lease expired: sender ' || coalesce(leased_by, '?')
                 || ' stopped during try ' || tries
WHERE id IN (SELECT id FROM notifications WHERE state = 'sending' AND lease_expires_at < now()
             ORDER BY lease_expires_at LIMIT 100 FOR UPDATE SKIP LOCKED)
RETURNING id
"""


def notifications_reap_expired(conn: sa.Connection) -> int:
    """Notifications whose sender stopped renewing its lease are due again at once (the try is
    counted: a sender that dies on one every time gives up on it after its tries)."""
    return len(driver(conn).execute(_REAP).fetchall())


def notifications_prune(conn: Any, *, days: float, batch: int) -> int:
    """Retention (the SECURITY DEFINER ``notifications_prune()``): ended notifications, and
    pending ones nobody ever tried, older than ``days``."""
    return int(one_row(driver(conn).execute(
        "SELECT notifications_prune(clock_timestamp() - make_interval(days => %(d)s::int), %(b)s)",
        {"d": int(days), "b": batch}))[0])


def notifications_waiting(conn: sa.Connection) -> tuple[int, float]:
    """Notifications not sent yet (pending or being sent), and the age in seconds of the
    oldest (0 when none)."""
    count, age = one_row(driver(conn).execute(
        "SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)"
        "::float8 FROM notifications WHERE state IN ('pending', 'sending')"))
    return int(count), float(age)


def notifications_table(conn: sa.Connection) -> bool:
    """Whether the schema has the notifications tables (a worker or relay also runs on the
    previous release's schema, which has not: there it notes nothing)."""
    return bool(one_row(driver(conn).execute(
        "SELECT to_regclass('notification_subjects') IS NOT NULL"))[0])
