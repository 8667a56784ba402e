"""The ``runtime_schedules`` table: schedules defined from code (``cronkeeper.schedules``), in
the application's own transaction, and what the leader reads to adopt them
(migrations/0015_runtime_schedules.sql says what each column holds).

Two kinds of caller:

- the application (``cronkeeper.schedules``): a SQLAlchemy ``Connection`` or a psycopg 3
  ``Connection`` in the caller's transaction, its search_path unknown: statements are
  schema-qualified (``schema`` given) and executed as ``cronkeeper.enqueue`` executes its own
  (``caller_rows``), so the caller's commit covers them. A put or a delete sends
  ``pg_notify`` on the schema's schedules channel (``db.wake.schedules_channel``), delivered
  at commit, which wakes the leader;
- the leader, on its term's connection (search_path set: ``schema`` None): every head at a
  term's start and the rows written since its last look (``runtime_heads``, ``runtime_xmin``),
  the specs of those that changed (``runtime_specs``), and the claim's fence
  (``runtime_fence``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.sql

from cronkeeper.db.engine import caller_rows, check_schema_name, driver, one_row
from cronkeeper.db.wake import schedules_channel, wake
from cronkeeper.errors import DatabaseError

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


def _in(schema: str | None) -> str:
    """The prefix that qualifies a table of ``schema`` (nothing: the session's search_path)."""
    return "" if schema is None else '"' + check_schema_name(schema) + '".'


# -- the application's statements ---------------------------------------------------------------
# One statement for the whole mapping. Rows whose spec is the one stored (same digest, not
# deleted) are left out before anything is written: no row version, no lock, no sequence
# number, no notification. The others take a version id from schedule_versions' own sequence
# (the id the leader records the version under) and a change number. An existing row is
# updated without touching deleted_at unless it was deleted (see the migration: a change then
# never holds a claim up); a new name is inserted, its incarnation its first version id.
_WRITE = """
WITH given AS MATERIALIZED (
    SELECT g.name, g.spec, g.canonical, g.digest
    FROM jsonb_to_recordset(%(rows)s::jsonb)
         AS g(name text, spec jsonb, canonical jsonb, digest text)
), todo AS MATERIALIZED (
    SELECT g.*, nextval(%(versions_seq)s::regclass) AS version_id,
           r.name IS NOT NULL AS known, r.deleted_at IS NOT NULL AS dead
    FROM given g LEFT JOIN {s}runtime_schedules r USING (name)
    WHERE r.name IS NULL OR r.deleted_at IS NOT NULL OR r.digest <> g.digest
), updated AS (
    UPDATE {s}runtime_schedules r
       SET spec = t.spec, canonical = t.canonical, digest = t.digest,
           version_id = t.version_id, xid = pg_current_xact_id(), updated_at = now(),
           incarnation = CASE WHEN r.deleted_at IS NULL THEN r.incarnation ELSE t.version_id END,
           deleted_at = NULL
      FROM todo t
     WHERE r.name = t.name AND t.known
    RETURNING r.name, r.version_id
), inserted AS (
    INSERT INTO {s}runtime_schedules (name, spec, canonical, digest, version_id, incarnation)
    SELECT name, spec, canonical, digest, version_id, version_id
    FROM todo WHERE NOT known
    RETURNING name, version_id
), written AS (
    SELECT name, version_id FROM updated UNION ALL SELECT name, version_id FROM inserted
), woke AS ({wake})
SELECT g.name, coalesce(w.version_id, r.version_id), w.name IS NOT NULL
FROM given g LEFT JOIN written w USING (name) LEFT JOIN {s}runtime_schedules r USING (name)
CROSS JOIN woke
"""


def runtime_write(connection: Any, schema: str, rows: Sequence[tuple[str, str, str, str]],
                  action: str, *, prefix: str | None = None) -> dict[str, tuple[int, bool]]:
    """Put ``rows`` (name, spec JSON, canonical JSON, digest) in one statement, in the
    caller's transaction; return {name: (version id, written)}: ``written`` False where the
    stored spec was already this one (nothing was written for it). The digests stored are
    looked at first, so the specs of unchanged rows are not even sent (a sync that changes
    little costs an index look-up per name); the statement checks them again. The rows to
    change are locked first, in name order (``runtime_lock``; with ``prefix``, a sync's, the
    rows it is about to delete too)."""
    stored = runtime_digests(connection, schema, [r[0] for r in rows], action) if rows else {}
    same = {r[0]: (stored[r[0]][1], False) for r in rows
            if r[0] in stored and stored[r[0]][0] == r[3]}
    rows = [r for r in rows if r[0] not in same]
    if rows or prefix is not None:
        runtime_lock(connection, schema, [r[0] for r in rows], action, prefix=prefix,
                     keep=[r[0] for r in rows] + list(same))
    if not rows:
        return same
    document = "[" + ",".join(
        f'{{"name":{json.dumps(n)},"spec":{s},"canonical":{c},"digest":{json.dumps(d)}}}'
        for n, s, c, d in rows) + "]"
    q = _in(schema)
    params = {"rows": document, "versions_seq": f"{q}schedule_versions_id_seq",
              "channel": schedules_channel(schema)}
    sql = _WRITE.format(s=q, wake=wake("written", "%(channel)s"))
    try:
        found = caller_rows(connection, sql, params, action)
    except DatabaseError as exc:
        if _duplicate(exc.__cause__):
            raise DatabaseError(f"{action}: another transaction created one of these schedules "
                                f"at the same time; retry ({exc})") from exc
        raise
    return {**same, **{name: (int(version_id), bool(written))
                       for name, version_id, written in found}}


# Every application statement that changes rows locks them in name order first: two
# transactions changing overlapping names (each in its own order, or as the plan visits them)
# then wait for one another instead of meeting "deadlock detected". FOR NO KEY UPDATE, the
# lock a put's UPDATE takes, never holds the leader's claim (FOR KEY SHARE) up; a delete's
# UPDATE, which changes the key column deleted_at, strengthens it to FOR UPDATE (the fence).
_LOCK = """
SELECT name FROM {s}runtime_schedules
WHERE name = ANY(%(names)s::text[])
   OR (%(prefix)s::text IS NOT NULL AND deleted_at IS NULL
       AND starts_with(name, %(prefix)s::text) AND NOT name = ANY(%(keep)s::text[]))
ORDER BY name
FOR NO KEY UPDATE
"""


def runtime_lock(connection: Any, schema: str, names: Sequence[str], action: str, *,
                 prefix: str | None = None, keep: Sequence[str] = ()) -> None:
    """Lock, in name order, the rows named and (``prefix``) the live ones whose name starts
    with it and is not in ``keep``: what a put, and a sync's deletes, are about to change."""
    caller_rows(connection, _LOCK.format(s=_in(schema)),
                {"names": list(names), "prefix": prefix, "keep": list(keep)}, action)


def runtime_digests(connection: Any, schema: str, names: Sequence[str], action: str
                    ) -> dict[str, tuple[str, int]]:
    """{name: (digest, version id)} of the live runtime schedules among ``names``."""
    sql = (f"SELECT name, digest, version_id FROM {_in(schema)}runtime_schedules"
           " WHERE name = ANY(%(names)s::text[]) AND deleted_at IS NULL")
    return {n: (d, int(v)) for n, d, v in caller_rows(connection, sql, {"names": list(names)},
                                                       action)}


_DELETE = """
WITH doomed AS MATERIALIZED (
    SELECT name FROM {s}runtime_schedules
     WHERE deleted_at IS NULL
       AND (name = ANY(%(names)s::text[])
            OR (%(prefix)s::text IS NOT NULL AND starts_with(name, %(prefix)s::text)
                AND NOT name = ANY(%(keep)s::text[])))
     ORDER BY name
       FOR UPDATE
), gone AS (
    UPDATE {s}runtime_schedules r
       SET deleted_at = now(), xid = pg_current_xact_id(), updated_at = now()
      FROM doomed d
     WHERE r.name = d.name AND r.deleted_at IS NULL
    RETURNING r.name
), woke AS ({wake})
SELECT name FROM gone CROSS JOIN woke
"""


def runtime_delete(connection: Any, schema: str, names: Sequence[str], action: str, *,
                   prefix: str | None = None, keep: Sequence[str] = ()) -> list[str]:
    """Delete (tombstone) the runtime schedules named, and with ``prefix`` every one whose name
    starts with it but is not in ``keep``; return the names deleted (those that were live).
    The rows are locked in name order first (``doomed``: see ``_LOCK``)."""
    q = _in(schema)
    params = {"names": list(names), "prefix": prefix, "keep": list(keep),
              "channel": schedules_channel(schema)}
    sql = _DELETE.format(s=q, wake=wake("gone", "%(channel)s"))
    return sorted(r[0] for r in caller_rows(connection, sql, params, action))


@dataclass(frozen=True, slots=True)
class RuntimeRow:
    """A live runtime schedule as ``get``, ``list`` and ``cronkeeper schedules`` show it."""

    name: str
    spec: dict[str, Any]
    version_id: int
    updated_at: Any
    canonical: dict[str, Any]  # the spec as its version stores it (a calendar's dates in it)


_LIST = """
SELECT name, spec, version_id, updated_at, canonical FROM {s}runtime_schedules
WHERE deleted_at IS NULL
  AND (%(names)s::text[] IS NULL OR name = ANY(%(names)s::text[]))
  AND (%(prefix)s::text IS NULL OR starts_with(name, %(prefix)s::text))
ORDER BY name
"""


def runtime_list(connection: Any, schema: str | None, *, names: Sequence[str] | None = None,
                 prefix: str | None = None, action: str = "reading runtime schedules"
                 ) -> list[RuntimeRow]:
    """The live runtime schedules (those named; those whose name starts with ``prefix``)."""
    params = {"names": list(names) if names is not None else None, "prefix": prefix}
    sql = _LIST.format(s=_in(schema))
    if schema is None:
        rows = driver(connection).execute(sql, params).fetchall()
    else:
        rows = caller_rows(connection, sql, params, action)
    return [RuntimeRow(*r) for r in rows]


# -- the leader's statements ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RuntimeHead:
    """What the leader compares with the version it has in force, before it reads a spec."""

    name: str
    version_id: int
    incarnation: int
    deleted: bool


def runtime_xmin(conn: psycopg.Connection) -> int:
    """The oldest transaction still running: every transaction below it has ended, so a look
    at the rows taken after this reads everything they wrote (the leader's poll cursor)."""
    return int(one_row(conn.execute(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8"))[0])


def runtime_heads(conn: psycopg.Connection, *, after: str = "", limit: int | None = None,
                  since: int | None = None) -> list[RuntimeHead]:
    """The heads of a page of rows by name (``after``, ``limit``: a term's first look at all
    of them), or (``since``) of the rows written by transactions at or above that xid: the
    poll, a range scan of the xid index, whatever the number of rows."""
    if since is not None:
        rows = conn.execute(
            """
            SELECT name, version_id, incarnation, deleted_at IS NOT NULL FROM runtime_schedules
            WHERE xid >= %(since)s::text::xid8
            """,
            {"since": since},
        ).fetchall()
    else:
        rows = conn.execute(
            """
            SELECT name, version_id, incarnation, deleted_at IS NOT NULL FROM runtime_schedules
            WHERE name > %(after)s ORDER BY name LIMIT %(limit)s
            """,
            {"after": after, "limit": limit},
        ).fetchall()
    return [RuntimeHead(*r) for r in rows]


def runtime_specs(conn: psycopg.Connection, names: Sequence[str]
                  ) -> dict[str, tuple[RuntimeHead, dict[str, Any], str]]:
    """{name: (head, canonical spec, digest)} of the named live rows (those the heads found
    changed)."""
    rows = conn.execute(
        """
        SELECT name, version_id, incarnation, canonical, digest FROM runtime_schedules
        WHERE name = ANY(%(names)s::text[]) AND deleted_at IS NULL
        """,
        {"names": list(names)},
    ).fetchall()
    return {r[0]: (RuntimeHead(r[0], r[1], r[2], False), r[3], r[4]) for r in rows}


def runtime_fence(conn: psycopg.Connection, names: Sequence[str]) -> dict[str, int]:
    """{name: incarnation} of the named runtime schedules that are live, each row locked FOR
    KEY SHARE until the caller's transaction ends: the claim's fence (migration 0015). A row a
    delete holds (or a revival) is skipped, not waited for: its periods wait for the next tick."""
    return dict(conn.execute(
        """
        SELECT name, incarnation FROM runtime_schedules
        WHERE name = ANY(%(names)s::text[]) AND deleted_at IS NULL
        FOR KEY SHARE SKIP LOCKED
        """,
        {"names": list(names)},
    ).fetchall())


def runtime_hold(conn: psycopg.Connection, name: str) -> tuple[int, Any] | None:
    """(incarnation, deleted_at) of the runtime schedule ``name``, its row locked FOR KEY SHARE
    until the caller's transaction ends; None when no runtime schedule has the name. The fence
    of an operator's claim (``backfill``, ``trigger``), as ``runtime_fence`` is the leader's:
    a delete in flight is waited for, not skipped (an operator asks once and wants the answer),
    and a delete that comes later waits for the claim, so nothing it writes is later than the
    delete's commit."""
    return conn.execute(
        "SELECT incarnation, deleted_at FROM runtime_schedules WHERE name = %(name)s"
        " FOR KEY SHARE",
        {"name": name},
    ).fetchone()


def _duplicate(cause: BaseException | None) -> bool:
    """A unique violation, from psycopg or (through a SQLAlchemy connection) wrapped by it."""
    if isinstance(cause, psycopg.errors.UniqueViolation):
        return True
    if "sqlalchemy" not in sys.modules:  # no SQLAlchemy connection made the statement
        return False
    from sqlalchemy.exc import IntegrityError
    return isinstance(cause, IntegrityError)


def runtime_live_among(conn: sa.Connection | psycopg.Connection, names: Sequence[str],
                       *, schema: str | None = None) -> list[str]:
    """The names among ``names`` held by a live runtime schedule (a file set naming one is
    refused). With ``schema``, the transaction names it itself (``SET LOCAL search_path``):
    ``run`` asks before its election has checked that the connection keeps its session, and
    through a transaction-pooling proxy the connection's own search_path is lost, so the
    proxy's refusal must come first, not "relation does not exist"."""
    if schema is not None:
        driver(conn).execute(psycopg.sql.SQL("SET LOCAL search_path TO {}").format(
            psycopg.sql.Identifier(schema)))
    return [r[0] for r in driver(conn).execute(
        "SELECT name FROM runtime_schedules WHERE deleted_at IS NULL"
        " AND name = ANY(%(names)s::text[]) ORDER BY name",
        {"names": list(names)},
    )]


def runtime_live_names(conn: sa.Connection | psycopg.Connection) -> set[str]:
    """Every live runtime schedule's name: what ``status``, the web and the metrics mark
    ``source = runtime``."""
    return {r[0] for r in driver(conn).execute(
        "SELECT name FROM runtime_schedules WHERE deleted_at IS NULL")}


def runtime_prune(conn: psycopg.Connection, *, days: float, batch: int) -> int:
    """Retention (the SECURITY DEFINER ``runtime_schedules_prune()``): tombstones older than
    ``days`` whose removal a leader has recorded."""
    return int(one_row(conn.execute(
        "SELECT runtime_schedules_prune(clock_timestamp() - make_interval(days => %(d)s::int),"
        " %(b)s)", {"d": int(days), "b": batch}))[0])
