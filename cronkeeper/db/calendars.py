"""The ``calendars`` table: the calendars the schedule files define, as the leader recorded them
when it adopted the file set (``calendars_record``), for runtime specs to name
(``calendars_named``, in the application's transaction; docs/runtime-schedules.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

from cronkeeper.db.engine import caller_rows, check_schema_name

_RECORD = """
WITH given AS (
    SELECT g.name, g.dates, g.origin
    FROM jsonb_to_recordset(%(rows)s::jsonb) AS g(name text, dates jsonb, origin text)
), written AS (
    INSERT INTO calendars AS c (name, dates, origin, term)
    SELECT name, dates, origin, %(term)s FROM given
    ON CONFLICT (name) DO UPDATE
       SET dates = excluded.dates, origin = excluded.origin, term = excluded.term,
           recorded_at = now(), removed_at = NULL
     WHERE c.dates IS DISTINCT FROM excluded.dates OR c.origin IS DISTINCT FROM excluded.origin
        OR c.removed_at IS NOT NULL
    RETURNING name
), gone AS (
    UPDATE calendars SET removed_at = now(), term = %(term)s
     WHERE removed_at IS NULL AND name NOT IN (SELECT name FROM given)
    RETURNING name
)
SELECT (SELECT count(*) FROM written), (SELECT count(*) FROM gone)
"""


def calendars_record(conn: psycopg.Connection, calendars: Sequence[tuple[str, list[str], str]],
                     term: int) -> tuple[int, int]:
    """Make the recorded calendars those of the file set: (name, ISO dates, file) each; those
    no longer defined are marked removed. Returns (written, removed); an unchanged set writes
    nothing."""
    rows = json.dumps([{"name": n, "dates": d, "origin": o} for n, d, o in calendars])
    row = conn.execute(_RECORD, {"rows": rows, "term": term}).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def calendars_named(connection: Any, schema: str, names: Sequence[str]
                    ) -> dict[str, tuple[list[str], str | None]]:
    """{name: (ISO dates, file)} of the recorded calendars among ``names`` (every one when
    ``names`` is empty: what an unknown name's did-you-mean looks among)."""
    rows = caller_rows(connection, f"""
        SELECT name, dates, origin FROM "{check_schema_name(schema)}".calendars
        WHERE removed_at IS NULL
          AND (cardinality(%(names)s::text[]) = 0 OR name = ANY(%(names)s::text[]))
        """, {"names": list(names)}, "reading the files' calendars")
    return {name: (dates, origin) for name, dates, origin in rows}
