"""The ``schedule_versions`` table: every version of every schedule the leaders adopted (a spec
stored as JSON, or None: the schedule was removed), appended only, each active from an instant.

The leader writes (``versions_insert``) and reads back the versions in force when its term
begins (``versions_in_force``); ``status``, ``history``, the web and the metrics read them all
(``versions_all``), or only what is new since they last looked (``versions_stamp``,
``versions_after``); a worker asks whether the version a job was written under is still the
newest (``versions_status``), and how much output the jobs of versions it has no file of keep
(``versions_output_limits``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from cronkeeper.db.engine import caller_rows, check_schema_name, driver, one_row

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


@dataclass(frozen=True, slots=True)
class VersionRow:
    """A version as the leader plans with it (``versions_in_force``)."""

    id: int
    schedule: str
    digest: str
    spec: dict[str, Any] | None
    active_from: datetime
    origin: str | None = None  # 'runtime', 'file:<path>', None (recorded by an older release)


# (id, schedule, spec or None, active_from): the rows ``audit.versions_from_rows`` reads.
VersionTuple = tuple[int, str, dict[str, Any] | None, datetime]


def versions_in_force(
    conn: sa.Connection | psycopg.Connection, after: str = "", limit: int | None = None
) -> list[VersionRow]:
    """The newest version of every schedule ever seen (spec None: removed), by name; with
    ``after`` and ``limit``, a page of them: the ``limit`` first schedules named after ``after``
    (the leader reads 100,000 a page at a time, each in its own transaction)."""
    rows = driver(conn).execute(
        """
        SELECT DISTINCT ON (schedule) id, schedule, digest, spec, active_from, origin
        FROM schedule_versions WHERE schedule > %(after)s
        ORDER BY schedule, active_from DESC, id DESC LIMIT %(limit)s
        """,
        {"after": after, "limit": limit},
    ).fetchall()
    return [VersionRow(*r) for r in rows]


def versions_insert(
    conn: psycopg.Connection,
    rows: Sequence[tuple[str, str, dict[str, Any] | str | None]],
    active_from: datetime,
    term: int,
    *,
    origins: Sequence[str | None] | None = None,
    ids: Sequence[int | None] | None = None,
    starts: Sequence[datetime | None] | None = None,
) -> dict[str, int]:
    """Record new versions (schedule, digest, spec or None for removal); return their ids.
    A spec is a dict or its JSON text. Per row, optionally: ``origins`` ('runtime',
    'file:<path>'), ``ids`` (the id a runtime put gave out; None: a new one) and ``starts``
    (its own active_from; None: ``active_from``). A row whose schedule already has a version
    at its instant, or whose id exists, is left out (another leader recorded it)."""
    if not rows:
        return {}
    n = len(rows)
    result = conn.execute(
        """
        INSERT INTO schedule_versions (id, schedule, digest, spec, active_from, term, origin)
        SELECT coalesce(i, nextval('schedule_versions_id_seq')), s, d, j::jsonb,
               coalesce(a, %(at)s), %(term)s, o
        FROM unnest(%(s)b::text[], %(d)b::text[], %(j)b::text[], %(o)b::text[], %(i)b::int8[],
                    %(a)b::timestamptz[]) AS v(s, d, j, o, i, a)
        ON CONFLICT DO NOTHING
        RETURNING schedule, id
        """,
        {
            "s": [r[0] for r in rows],
            "d": [r[1] for r in rows],
            "j": [r[2] if r[2] is None or isinstance(r[2], str) else json.dumps(r[2])
                  for r in rows],
            "o": list(origins) if origins is not None else [None] * n,
            "i": list(ids) if ids is not None else [None] * n,
            "a": list(starts) if starts is not None else [None] * n,
            "at": active_from,
            "term": term,
        },
    ).fetchall()
    return dict(result)


def versions_file_held(conn: sa.Connection | psycopg.Connection, names: Sequence[str],
                       schema: str | None = None) -> dict[str, str]:
    """{name: origin} of the names among ``names`` whose version in force is a file's (not a
    runtime schedule's, not a removal): the names a runtime put must refuse. ``origin`` is
    'file:<path>', or 'file' for a version an older release recorded. ``schema``: qualify the
    table (an application's connection)."""
    table = "schedule_versions" if schema is None else f'"{check_schema_name(schema)}".schedule_versions'
    sql = f"""
        SELECT schedule, coalesce(origin, 'file') FROM (
            SELECT DISTINCT ON (schedule) schedule, origin, spec IS NOT NULL AS live
            FROM {table} WHERE schedule = ANY(%(names)s::text[])
            ORDER BY schedule, active_from DESC, id DESC
        ) v WHERE live AND origin IS DISTINCT FROM 'runtime'
    """
    params = {"names": list(names)}
    if schema is None:
        return dict(driver(conn).execute(sql, params).fetchall())
    return dict(caller_rows(conn, sql, params, "reading the schedule files' names"))


def versions_all(
    conn: sa.Connection | psycopg.Connection, schedules: Sequence[str] | None = None
) -> list[VersionTuple]:
    """Every version of the schedules (all when None): (id, schedule, spec, active_from),
    ordered by schedule, then oldest first (one schedule's: its history, the newest last)."""
    return driver(conn).execute(
        """
        SELECT id, schedule, spec, active_from FROM schedule_versions
        WHERE %(names)s::text[] IS NULL OR schedule = ANY(%(names)s::text[])
        ORDER BY schedule, active_from, id
        """,
        {"names": list(schedules) if schedules is not None else None},
    ).fetchall()


def versions_heads(conn: sa.Connection | psycopg.Connection) -> list[tuple[int, str, bool, datetime]]:
    """The newest version of every schedule ever seen, without its spec: (id, schedule, removed,
    active_from), by name. What a reader that keeps figures per version (``status`` with the
    leader's summaries) needs to know which are still in force, without parsing a spec."""
    return driver(conn).execute(
        """
        SELECT DISTINCT ON (schedule) id, schedule, spec IS NULL, active_from
        FROM schedule_versions ORDER BY schedule, active_from DESC, id DESC
        """
    ).fetchall()


def versions_after(conn: sa.Connection | psycopg.Connection, after_id: int) -> list[VersionTuple]:
    """Versions recorded after ``after_id`` (id, schedule, spec, active_from), in id order: a
    range scan of the primary key. Readers that keep parsed versions read only what is new."""
    return driver(conn).execute(
        "SELECT id, schedule, spec, active_from FROM schedule_versions WHERE id > %(id)s ORDER BY id",
        {"id": after_id},
    ).fetchall()


def versions_stamp(conn: sa.Connection | psycopg.Connection) -> tuple[int, int]:
    """(highest id, row count) of ``schedule_versions``: versions are only ever appended, so an
    unchanged stamp means the parsed versions a reader keeps are still current. An index-only
    look at the primary key plus a count."""
    row = one_row(driver(conn).execute(
        "SELECT coalesce(max(id), 0), count(*) FROM schedule_versions"
    ))
    return int(row[0]), int(row[1])


def versions_output_limits(conn: sa.Connection, version_ids: Sequence[int]) -> dict[int, int | None]:
    """The ``output_limit`` in each of these versions' specs, in bytes; None where the spec
    leaves it out (the default: ``ScheduleSpec.to_json`` writes the key only when it is not,
    and a spec stored before the key existed has none). Versions that do not exist are left
    out."""
    rows = driver(conn).execute(
        "SELECT id, CASE WHEN jsonb_typeof(spec -> 'output_limit') = 'number' "
        "THEN (spec ->> 'output_limit')::bigint END FROM schedule_versions "
        "WHERE id = ANY(%(ids)s::bigint[])", {"ids": list(version_ids)}).fetchall()
    return {vid: None if limit is None else int(limit) for vid, limit in rows}


def versions_status(conn: sa.Connection, version_id: int) -> tuple[str, bool] | None:
    """(digest, newest) of a schedule version; None when there is no such version."""
    row = driver(conn).execute(
        """
        SELECT v.digest, NOT EXISTS (SELECT 1 FROM schedule_versions n
                                     WHERE n.schedule = v.schedule AND n.active_from > v.active_from)
        FROM schedule_versions v WHERE v.id = %(id)s
        """,
        {"id": version_id},
    ).fetchone()
    return (row[0], bool(row[1])) if row else None
