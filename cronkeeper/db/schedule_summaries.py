"""The ``schedule_summaries`` table (migrations/0014): per schedule in force, the figures the
leader's summarizer (``cronkeeper/summarizer.py``) keeps for ``status``, the web and the
metrics: its next undecided fire, the periods missing in the hour before ``computed_at``, and
the run-time figures of its last 100 finished attempts, each row under the version (and term)
it was computed with. Written a batch per transaction by the leader, on its lock session (no
DELETE: the scheduler's role has none; a removed schedule's row stays, never read again, since
its version is no longer in force);
read whole by the readers, which judge each row's freshness themselves
(``cronkeeper.summary``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg

from cronkeeper.db.engine import driver, one_row

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


class SummaryRow(NamedTuple):
    """One schedule's row, as written and as read (``age_seconds``: on reading, the database's
    now minus ``computed_at``; 0.0 when written)."""

    schedule: str
    version_id: int
    owner: str | None
    timeout_seconds: float
    grace_seconds: float
    decided_through: datetime  # the instant the next fire was computed after
    # every fire after decided_through up to the last one listed (at least one, unless the
    # schedule fires no more): the next undecided fire after any later decided period too
    next_fires: list[datetime]
    missing_last_hour: int | None  # None: no version in force during that hour
    missing_first: list[datetime]  # the earliest of those missing periods (at most 64)
    duration_attempts: int
    duration_p50_seconds: float | None
    duration_p99_seconds: float | None
    attempts_timed_out_24h: int
    term: int
    computed_at: datetime
    age_seconds: float = 0.0


_COLUMNS = SummaryRow._fields[:-1]

# (next_fires travel as array literals: unnest would flatten an array of arrays)
_WRITE = f"""
INSERT INTO schedule_summaries ({", ".join(_COLUMNS)})
SELECT s, v, o, t, g, d, f::timestamptz[], m, mf::timestamptz[], n, p50, p99, x, term, c
FROM unnest(%(schedule)s::text[], %(version_id)s::bigint[], %(owner)s::text[],
                     %(timeout_seconds)s::float8[], %(grace_seconds)s::float8[],
                     %(decided_through)s::timestamptz[], %(next_fires)s::text[],
                     %(missing_last_hour)s::int[], %(missing_first)s::text[],
                     %(duration_attempts)s::int[],
                     %(duration_p50_seconds)s::float8[], %(duration_p99_seconds)s::float8[],
                     %(attempts_timed_out_24h)s::int[], %(term)s::bigint[],
                     %(computed_at)s::timestamptz[])
     AS r(s, v, o, t, g, d, f, m, mf, n, p50, p99, x, term, c)
ON CONFLICT (schedule) DO UPDATE SET
{", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[1:])}
"""


def summaries_write(conn: psycopg.Connection | sa.Connection, rows: Sequence[SummaryRow]) -> None:
    """Insert or replace the rows of a batch of schedules, in one statement."""
    if not rows:
        return
    params: dict[str, list] = {c: [getattr(r, c) for r in rows] for c in _COLUMNS}
    for column in ("next_fires", "missing_first"):
        params[column] = ["{" + ",".join(f.isoformat() for f in getattr(r, column)) + "}"
                          for r in rows]
    driver(conn).execute(_WRITE, params)


def summaries_read(conn: psycopg.Connection | sa.Connection,
                   schedules: Sequence[str] | None = None) -> dict[str, SummaryRow]:
    """Every row (or those of ``schedules``), with its age on the database's clock; {} on a
    schema without the table (a reader of this release on the previous release's schema)."""
    d = driver(conn)
    if not one_row(d.execute("SELECT to_regclass('schedule_summaries') IS NOT NULL"))[0]:
        return {}
    rows: Any = d.execute(
        f"SELECT {', '.join(_COLUMNS)}, extract(epoch FROM now() - computed_at)::float8 "
        "FROM schedule_summaries "
        "WHERE %(names)s::text[] IS NULL OR schedule = ANY(%(names)s::text[])",
        {"names": None if schedules is None else list(schedules)}).fetchall()
    return {r[0]: SummaryRow(*r) for r in rows}
