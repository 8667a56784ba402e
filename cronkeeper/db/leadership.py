"""The ``leadership`` table and the advisory lock it records: statements of the leader election,
run on the dedicated lock session (a raw psycopg connection in autocommit mode, so each
statement's transaction is explicit), and the reads of who leads.

The session itself (its backend pid, its idle timeout, whether a pooler pins it) is
``db/sessions.py``'s."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from cronkeeper.db.engine import (
    SERVER_KEEPALIVES,
    advisory_key_parts,
    check_schema_name,
    conninfo,
    driver,
    one_row,
)

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    from sqlalchemy.engine import URL

    from cronkeeper.db.engine import Connection

# True when this session holds the cluster's advisory lock (bigint key: classid/objid, objsubid 1).
_HOLDS_LOCK = """
    EXISTS (SELECT 1 FROM pg_locks
            WHERE locktype = 'advisory' AND classid = %(classid)s AND objid = %(objid)s
              AND objsubid = 1 AND granted AND pid = pg_backend_pid())
"""


def lock_connect(url: URL, schema: str, application_name: str) -> psycopg.Connection:
    """The lock session: autocommit, search_path on ``schema``, keepalives on both sides."""
    check_schema_name(schema)
    return psycopg.connect(
        conninfo(url, options=f"-c search_path={schema} {SERVER_KEEPALIVES}"),
        autocommit=True,
        application_name=application_name,
        connect_timeout=10,
    )


def lock_wait(conn: psycopg.Connection, key: int) -> bool:
    """Block on the lock itself until it is granted: True. False when the wait was cancelled
    (``conn.cancel_safe()`` from another thread, on shutdown)."""
    try:
        conn.execute("SELECT pg_advisory_lock(%(key)s)", {"key": key})
    except psycopg.errors.QueryCanceled:
        return False
    return True


def lock_release(conn: psycopg.Connection, key: int) -> None:
    conn.execute("SELECT pg_advisory_unlock(%(key)s)", {"key": key})


def lock_holder_pid(conn: psycopg.Connection | Connection, key: int) -> int | None:
    """The backend that holds advisory lock ``key`` (the leader's session), or None."""
    classid, objid = advisory_key_parts(key)
    row = driver(conn).execute(
        """
        SELECT pid FROM pg_locks
        WHERE locktype = 'advisory' AND classid = %(classid)s AND objid = %(objid)s
          AND objsubid = 1 AND granted
        """,
        {"classid": classid, "objid": objid},
    ).fetchone()
    return row[0] if row else None


def leadership_claim(conn: psycopg.Connection, cluster: str, instance_id: str) -> tuple[int, datetime]:
    """Record a win: the term goes up by one (the fencing token)."""
    row = one_row(conn.execute(
        """
        INSERT INTO leadership AS l (cluster, term, instance_id, backend_pid, since, heartbeat_at)
        VALUES (%(cluster)s, 1, %(instance)s, pg_backend_pid(), clock_timestamp(), clock_timestamp())
        ON CONFLICT (cluster) DO UPDATE
           SET term = l.term + 1, instance_id = excluded.instance_id,
               backend_pid = excluded.backend_pid, since = excluded.since,
               heartbeat_at = excluded.heartbeat_at, released_at = NULL
        RETURNING term, since
        """,
        {"cluster": cluster, "instance": instance_id},
    ))
    return row[0], row[1]


def leadership_confirm(
    conn: psycopg.Connection, cluster: str, term: int, key: int
) -> datetime | None:
    """Heartbeat and fence in one statement: succeeds (returning the database's now) only while
    this session still holds the lock and the term is still ours. Run it first in every write
    transaction of the leader."""
    classid, objid = advisory_key_parts(key)
    row = conn.execute(
        f"""
        UPDATE leadership SET heartbeat_at = clock_timestamp()
        WHERE cluster = %(cluster)s AND term = %(term)s AND {_HOLDS_LOCK}
        RETURNING heartbeat_at
        """,
        {"cluster": cluster, "term": term, "classid": classid, "objid": objid},
    ).fetchone()
    return row[0] if row else None


def leadership_release(conn: psycopg.Connection, cluster: str, term: int) -> None:
    conn.execute(
        """
        UPDATE leadership SET released_at = clock_timestamp()
        WHERE cluster = %(cluster)s AND term = %(term)s
        """,
        {"cluster": cluster, "term": term},
    )


def leadership_depose_stale(
    conn: psycopg.Connection, cluster: str, key: int, stale_after: float
) -> int | None:
    """Terminate the backend of a leader whose heartbeat is older than ``stale_after`` seconds
    (a frozen process or a stalled tick), which frees its lock. Only the backend recorded with
    the stale heartbeat is touched, so a leader that has just won is never deposed: a pid is a
    number the server reuses (after a failover or restart the numbers start again), so the lock
    holder must also be a backend that already existed when that leader won (``backend_start``
    at or before ``since``); a newer backend that happens to carry the recorded pid is left alone.
    Returns the terminated backend pid, or None."""
    classid, objid = advisory_key_parts(key)
    row = conn.execute(
        """
        SELECT l.pid, pg_terminate_backend(l.pid)
        FROM pg_locks l JOIN leadership ld ON ld.backend_pid = l.pid
          JOIN pg_stat_activity a ON a.pid = l.pid AND a.backend_start <= ld.since
        WHERE l.locktype = 'advisory' AND l.classid = %(classid)s AND l.objid = %(objid)s
          AND l.objsubid = 1 AND l.granted
          AND ld.cluster = %(cluster)s AND ld.released_at IS NULL
          AND ld.heartbeat_at < clock_timestamp() - make_interval(secs => %(stale)s)
        """,
        {"classid": classid, "objid": objid, "cluster": cluster, "stale": stale_after},
    ).fetchone()
    return row[0] if row and row[1] else None


def leadership_current(conn: Connection | psycopg.Connection, cluster: str) -> dict[str, Any] | None:
    """The cluster's leadership row with the heartbeat's age in seconds, or None."""
    cur = driver(conn).execute(
        """
        SELECT term, instance_id, since, heartbeat_at, released_at,
               extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 AS heartbeat_age
        FROM leadership WHERE cluster = %(cluster)s
        """,
        {"cluster": cluster},
    )
    row = cur.fetchone()
    if row is None:
        return None
    return dict(zip([d.name for d in cur.description or ()], row, strict=True))
