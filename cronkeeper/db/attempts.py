"""The ``attempts`` table: one row per attempt at a job, written by the fenced statements of the
outbox (``db/outbox_claims.py``, ``db/outbox_endings.py``) in the same statement as the job's
change. Read here: one job's attempts (``explain``, ``dlq``), run times per schedule
(``status``, the web, the metrics), the fleet's attempt counters; and renumbered before a dead
letter is replayed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row

from cronkeeper.db.engine import driver, one_row

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa

_ATTEMPTS_RENUMBER = """
UPDATE attempts a SET attempt = -a.attempt - 1000 * (
    SELECT count(*) FROM attempts p WHERE p.job_id = a.job_id AND p.attempt < 0)
WHERE a.job_id = ANY(%(ids)s::bigint[]) AND a.attempt > 0
"""


def attempts_archive(conn: sa.Connection, ids: list[int]) -> None:
    """Before a replay resets ``outbox.attempts`` to 0, renumber the job's recorded attempts to
    negative numbers (-1, -2, ... then -1001, ... for a second replay) so the fresh attempts 1..N
    do not collide with them under UNIQUE (job_id, attempt). ``explain`` lists them by start."""
    driver(conn).execute(_ATTEMPTS_RENUMBER, {"ids": ids})


_ATTEMPTS_FOR_JOB = """
SELECT attempt, worker_id, started_at, finished_at, outcome, error,
       octet_length(output) AS output_bytes,
       substring(output FROM greatest(octet_length(output) - %(window)s + 1, 1)) AS output_end
FROM attempts WHERE job_id = %(id)s ORDER BY started_at, id
"""


def attempts_for_job(conn: sa.Connection, job_id: int, window: int = 16384) -> list[dict[str, Any]]:
    """A job's attempts, oldest first, each with the size of its output (``output_bytes``,
    None when nothing was kept) and the last ``window`` bytes of it (``output_end``)."""
    cur = driver(conn).cursor(row_factory=dict_row)
    return cur.execute(_ATTEMPTS_FOR_JOB, {"id": job_id, "window": window}).fetchall()


# Output (migrations/0010). The newest attempt is the latest started: after a replay the
# earlier ones are numbered negative (attempts_archive), so numbers do not order them.
_OUTPUT_COLUMN = """
SELECT EXISTS (SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass('attempts') AND attname = 'output' AND NOT attisdropped)
"""


def attempts_output_column(conn: sa.Connection) -> bool:
    """Whether the schema keeps attempts' output (a worker also runs on the previous release's
    schema, which has no such column)."""
    return bool(driver(conn).execute(_OUTPUT_COLUMN).fetchone()[0])  # type: ignore[index]


_OUTPUT_RECORD = "UPDATE attempts SET output = %(output)s WHERE job_id = %(id)s AND attempt = %(attempt)s"


def attempts_output_record(conn: sa.Connection, *, job_id: int, attempt: int, output: bytes) -> None:
    """Write one attempt's output on its own: for a job whose handler process committed the
    job's completion itself, while the worker read what it printed."""
    driver(conn).execute(_OUTPUT_RECORD, {"id": job_id, "attempt": attempt, "output": output})


_OUTPUT_BY_KEY = """
SELECT o.id AS job_id, a.attempt, a.outcome, a.output
FROM outbox o
LEFT JOIN LATERAL (
    SELECT attempt, outcome, output FROM attempts
    WHERE job_id = o.id AND (%(attempt)s::int IS NULL OR attempt = %(attempt)s)
    ORDER BY started_at DESC, id DESC LIMIT 1
) a ON true
WHERE o.idempotency_key = %(key)s
"""


def attempts_output_by_key(conn: sa.Connection, key: str, attempt: int | None = None) -> dict[str, Any] | None:
    """The output of the job's attempt ``attempt``, or of its newest one: None when no job
    has that key; ``attempt`` None in the row when it has no such attempt."""
    cur = driver(conn).cursor(row_factory=dict_row)
    return cur.execute(_OUTPUT_BY_KEY, {"key": key, "attempt": attempt}).fetchone()


_LAST_OUTPUT = """
SELECT output FROM attempts WHERE job_id = %(id)s ORDER BY started_at DESC, id DESC LIMIT 1
"""


def attempts_last_output(conn: sa.Connection, job_id: int) -> bytes | None:
    """What the job's newest attempt printed (None: no attempt, or nothing kept)."""
    row = driver(conn).execute(_LAST_OUTPUT, {"id": job_id}).fetchone()
    return None if row is None or row[0] is None else bytes(row[0])


# Per schedule, from its last %(last)s finished attempts (newest period first, then newest
# attempt): their count and the p50 and p99 run time, a timed-out attempt counted at its job's
# timeout; and the attempts that timed out in the last 24 hours. Attempts that ended without
# running to an end of their own (lease_expired, released, a relay's published) are not run
# times. Indexes: a backward range scan of ``outbox_schedule_period`` per schedule, each job's
# attempts from ``attempts_job_id_attempt_key``, the scan stopping at the sample; the 24-hour
# count from the ``attempts_timed_out`` partial index (migrations/0009), which holds only
# timed-out attempts.
RUNTIMES = """
WITH timed_out AS (
    SELECT o.schedule, count(*) AS n
    FROM attempts a JOIN outbox o ON o.id = a.job_id
    WHERE a.outcome = 'timeout' AND a.finished_at > now() - interval '24 hours'
    GROUP BY o.schedule
)
SELECT s.name, r.n, r.p50, r.p99, coalesce(t.n, 0)
FROM unnest(%(names)s::text[]) AS s(name)
CROSS JOIN LATERAL (
    SELECT count(*) AS n,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY d) AS p50,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY d) AS p99
    FROM (SELECT CASE WHEN a.outcome = 'timeout' THEN o.timeout_seconds
                      ELSE extract(epoch FROM a.finished_at - a.started_at)::float8 END AS d
          FROM outbox o JOIN attempts a ON a.job_id = o.id
          WHERE o.schedule = s.name AND a.outcome IN ('succeeded', 'retry', 'dead', 'timeout')
          ORDER BY o.scheduled_for DESC, a.attempt DESC
          LIMIT %(last)s) sample
) r
LEFT JOIN timed_out t ON t.schedule = s.name
"""


def attempts_runtimes(
    conn: sa.Connection | psycopg.Connection, schedules: list[str], last: int = 100
) -> dict[str, tuple[int, float | None, float | None, int]]:
    """Each schedule's run-time figures, in one statement: name -> (finished attempts in the
    sample, p50 seconds, p99 seconds, attempts timed out in the last 24 hours). p50 and p99
    are None when no attempt has finished."""
    if not schedules:
        return {}
    rows = driver(conn).execute(RUNTIMES, {"names": list(schedules), "last": last}).fetchall()
    return {name: (int(n), p50, p99, int(t)) for name, n, p50, p99, t in rows}


def attempts_high_water(conn: sa.Connection | psycopg.Connection) -> int:
    """The highest attempt id: grows by one per claim, fleet-wide (a counter)."""
    return one_row(driver(conn).execute("SELECT coalesce(max(id), 0) FROM attempts"))[0]


def attempts_recent(conn: sa.Connection | psycopg.Connection, seconds: float) -> tuple[int, int, int]:
    """(failed, finished) attempts in the last ``seconds``, and failed in the ``seconds``
    before that. Failed: retry, timeout, lease_expired, dead. Uses ``attempts_finished_at``."""
    row = one_row(driver(conn).execute(
        """
        SELECT count(*) FILTER (WHERE finished_at > clock_timestamp() - w
                                AND outcome IN ('retry', 'timeout', 'lease_expired', 'dead')),
               count(*) FILTER (WHERE finished_at > clock_timestamp() - w),
               count(*) FILTER (WHERE finished_at <= clock_timestamp() - w
                                AND outcome IN ('retry', 'timeout', 'lease_expired', 'dead'))
        FROM attempts, make_interval(secs => %(s)s) AS w
        WHERE finished_at > clock_timestamp() - 2 * w
        """,
        {"s": seconds},
    ))
    return int(row[0]), int(row[1]), int(row[2])
