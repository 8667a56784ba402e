"""The ``instances`` table: who runs, where, with which schedule set, and how far its clock is
off. Schedulers register and beat with ``instances_heartbeat``; workers and relays (lease
holders) with ``instances_register_holder`` and ``instances_heartbeat_holder``; ``status``, the
web and the metrics read it back."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg

from cronkeeper.db.engine import driver, one_row

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    import sqlalchemy as sa


def _dicts(cur: psycopg.Cursor) -> list[dict[str, Any]]:
    names = [d.name for d in cur.description or ()]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def instances_heartbeat(
    conn: sa.Connection,
    *,
    cluster: str,
    instance_id: str,
    kind: str,
    host: str,
    pid: int,
    version: str,
    schedules_digest: str,
    tzdata_version: str,
    role: str,
    local_now: datetime,
) -> datetime:
    """Register or refresh a scheduler (its start kept), measuring its clock's skew (database
    clock minus ``local_now``, the host's clock read just before); return the database's clock."""
    return one_row(driver(conn).execute(
        """
        INSERT INTO instances (cluster, instance_id, kind, host, pid, version, schedules_digest,
                               tzdata_version, role, started_at, heartbeat_at, clock_skew_seconds)
        VALUES (%(cluster)s, %(instance)s, %(kind)s, %(host)s, %(pid)s, %(version)s, %(digest)s,
                %(tzdata)s, %(role)s, clock_timestamp(), clock_timestamp(),
                extract(epoch FROM clock_timestamp() - %(local)s::timestamptz))
        ON CONFLICT (cluster, instance_id) DO UPDATE
        SET kind = EXCLUDED.kind, host = EXCLUDED.host, pid = EXCLUDED.pid,
            version = EXCLUDED.version, schedules_digest = EXCLUDED.schedules_digest,
            tzdata_version = EXCLUDED.tzdata_version, role = EXCLUDED.role,
            heartbeat_at = EXCLUDED.heartbeat_at, clock_skew_seconds = EXCLUDED.clock_skew_seconds
        RETURNING clock_timestamp()
        """,
        {"cluster": cluster, "instance": instance_id, "kind": kind, "host": host, "pid": pid,
         "version": version, "digest": schedules_digest, "tzdata": tzdata_version, "role": role,
         "local": local_now},
    ))[0]


def instances_stopped(conn: sa.Connection, cluster: str, instance_id: str) -> None:
    """A gracefully stopped instance records that it stopped (role ``stopped``, migration 8),
    its last heartbeat kept: no longer live, and shown as stopped rather than stale. On a schema
    before migration 8 (an instance of this release stopping before ``migrate`` ran, in a
    rolling upgrade) the check refuses the role, and the heartbeat is backdated instead, as
    0.1.0 did, so that it still leaves the live instances at once."""
    from sqlalchemy.exc import IntegrityError  # this caller's connection is SQLAlchemy's

    params = {"cluster": cluster, "instance": instance_id}
    try:
        with conn.begin_nested():
            conn.exec_driver_sql(
                """
                UPDATE instances SET role = 'stopped'
                WHERE cluster = %(cluster)s AND instance_id = %(instance)s
                """,
                params,
            )
    except IntegrityError:
        conn.exec_driver_sql(
            """
            UPDATE instances SET heartbeat_at = clock_timestamp() - interval '1 day'
            WHERE cluster = %(cluster)s AND instance_id = %(instance)s
            """,
            params,
        )


def instances_register_holder(
    conn: sa.Connection, *, cluster: str, instance_id: str, host: str, pid: int,
    version: str, schedules_digest: str, tzdata_version: str, kind: str = "worker",
) -> None:
    """Register a worker (or, ``kind="relay"``, a relay: its digest is its config file's),
    its start counted from now."""
    driver(conn).execute(
        """
        INSERT INTO instances (cluster, instance_id, kind, host, pid, version, schedules_digest,
                               tzdata_version, role)
        VALUES (%(cluster)s, %(instance)s, %(kind)s, %(host)s, %(pid)s, %(version)s, %(digest)s,
                %(tzdata)s, %(kind)s)
        ON CONFLICT (cluster, instance_id) DO UPDATE
        SET kind = EXCLUDED.kind, role = EXCLUDED.role, host = EXCLUDED.host, pid = EXCLUDED.pid,
            version = EXCLUDED.version, schedules_digest = EXCLUDED.schedules_digest,
            tzdata_version = EXCLUDED.tzdata_version, started_at = clock_timestamp(),
            heartbeat_at = clock_timestamp()
        """,
        {"cluster": cluster, "instance": instance_id, "host": host, "pid": pid,
         "version": version, "digest": schedules_digest, "tzdata": tzdata_version, "kind": kind},
    )


def instances_heartbeat_holder(
    conn: sa.Connection, *, cluster: str, instance_id: str, local_now: datetime | None = None,
) -> float | None:
    """Refresh a worker's (or relay's) heartbeat; with ``local_now``, the host's clock read just
    before, also measure its skew (database clock minus host clock) and return it."""
    row = driver(conn).execute(
        """
        UPDATE instances SET heartbeat_at = clock_timestamp(),
            clock_skew_seconds = coalesce(
                extract(epoch FROM clock_timestamp() - %(local)s::timestamptz)::float8,
                clock_skew_seconds)
        WHERE cluster = %(cluster)s AND instance_id = %(instance)s
        RETURNING clock_skew_seconds
        """,
        {"cluster": cluster, "instance": instance_id, "local": local_now},
    ).fetchone()
    return None if row is None or local_now is None else row[0]


def instances_live(
    conn: sa.Connection | psycopg.Connection, cluster: str, within_seconds: float = 30.0
) -> list[dict[str, Any]]:
    """Instances of the cluster whose heartbeat is recent and that have not stopped, schedulers
    first."""
    return _dicts(driver(conn).execute(
        """
        SELECT instance_id, kind, host, pid, version, schedules_digest, tzdata_version, role,
               started_at, heartbeat_at, clock_skew_seconds
        FROM instances
        WHERE cluster = %(c)s AND heartbeat_at > clock_timestamp() - make_interval(secs => %(w)s)
          AND role <> 'stopped'
        ORDER BY kind, instance_id
        """,
        {"c": cluster, "w": within_seconds},
    ))


def instances_stopped_recently(
    conn: sa.Connection | psycopg.Connection, cluster: str, within_seconds: float
) -> list[dict[str, Any]]:
    """Instances that stopped gracefully (role ``stopped``) within ``within_seconds``; their
    heartbeat is their last one, so it says when they stopped."""
    return _dicts(driver(conn).execute(
        """
        SELECT instance_id, kind, host, version, heartbeat_at FROM instances
        WHERE cluster = %(c)s AND role = 'stopped'
          AND heartbeat_at > clock_timestamp() - make_interval(secs => %(w)s)
        ORDER BY kind, instance_id
        """,
        {"c": cluster, "w": within_seconds},
    ))


def instances_all(conn: sa.Connection | psycopg.Connection, cluster: str) -> list[dict[str, Any]]:
    """Every registered instance of the cluster, stale ones too, with its heartbeat's age in
    seconds (the primary key's cluster prefix)."""
    return _dicts(driver(conn).execute(
        """
        SELECT instance_id, kind, host, pid, version, schedules_digest, tzdata_version, role,
               started_at, heartbeat_at, clock_skew_seconds,
               extract(epoch FROM clock_timestamp() - heartbeat_at)::float8 AS heartbeat_age
        FROM instances WHERE cluster = %(c)s
        ORDER BY kind, instance_id
        """,
        {"c": cluster},
    ))
