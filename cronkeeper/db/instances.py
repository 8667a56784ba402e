"""Instance registry: who runs, where, with which schedule set, and how far its clock is off."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

from cronkeeper.db.engine import driver
from cronkeeper.db.tables import instances


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
    """Register or refresh this instance; return the database's clock (for skew)."""
    now = sa.func.clock_timestamp()
    values = dict(
        cluster=cluster, instance_id=instance_id, kind=kind, host=host, pid=pid, version=version,
        schedules_digest=schedules_digest, tzdata_version=tzdata_version, role=role,
        heartbeat_at=now,
        clock_skew_seconds=sa.func.extract("epoch", now - sa.literal(local_now, sa.TIMESTAMP(timezone=True))),
    )
    stmt = insert(instances).values(started_at=now, **values)
    stmt = stmt.on_conflict_do_update(index_elements=["cluster", "instance_id"], set_=values)
    conn.execute(stmt)
    return conn.execute(sa.select(now)).scalar_one()


def instances_stopped(conn: sa.Connection, cluster: str, instance_id: str) -> None:
    """A gracefully stopped instance records that it stopped (role ``stopped``, migration 8),
    its last heartbeat kept: no longer live, and shown as stopped rather than stale. On a schema
    before migration 8 (an instance of this release stopping before ``migrate`` ran, in a
    rolling upgrade) the check refuses the role, and the heartbeat is backdated instead, as
    0.1.0 did, so that it still leaves the live instances at once."""
    where = (instances.c.cluster == cluster, instances.c.instance_id == instance_id)
    try:
        with conn.begin_nested():
            conn.execute(sa.update(instances).where(*where).values(role="stopped"))
    except sa.exc.IntegrityError:
        conn.execute(
            sa.update(instances).where(*where)
            .values(heartbeat_at=sa.func.clock_timestamp() - sa.text("interval '1 day'"))
        )


# Workers and relays (lease holders) register and beat with these; the scheduler above.
_REGISTER = """
INSERT INTO instances (cluster, instance_id, kind, host, pid, version, schedules_digest,
                       tzdata_version, role)
VALUES (%(cluster)s, %(instance)s, %(kind)s, %(host)s, %(pid)s, %(version)s, %(digest)s,
        %(tzdata)s, %(kind)s)
ON CONFLICT (cluster, instance_id) DO UPDATE
SET kind = EXCLUDED.kind, role = EXCLUDED.role, host = EXCLUDED.host, pid = EXCLUDED.pid,
    version = EXCLUDED.version, schedules_digest = EXCLUDED.schedules_digest,
    tzdata_version = EXCLUDED.tzdata_version, started_at = clock_timestamp(),
    heartbeat_at = clock_timestamp()
"""


def instances_register_holder(
    conn: sa.Connection, *, cluster: str, instance_id: str, host: str, pid: int,
    version: str, schedules_digest: str, tzdata_version: str, kind: str = "worker",
) -> None:
    """Register a worker (or, ``kind="relay"``, a relay: its digest is its config file's)."""
    params = {
        "cluster": cluster, "instance": instance_id, "host": host, "pid": pid,
        "version": version, "digest": schedules_digest, "tzdata": tzdata_version, "kind": kind,
    }
    driver(conn).execute(_REGISTER, params)


_HEARTBEAT = """
UPDATE instances SET heartbeat_at = clock_timestamp(),
    clock_skew_seconds = coalesce(
        extract(epoch FROM clock_timestamp() - %(local)s::timestamptz)::float8, clock_skew_seconds)
WHERE cluster = %(cluster)s AND instance_id = %(instance)s
RETURNING clock_skew_seconds
"""


def instances_heartbeat_holder(
    conn: sa.Connection, *, cluster: str, instance_id: str, local_now: datetime | None = None,
) -> float | None:
    """Refresh a worker's (or relay's) heartbeat; with ``local_now``, the host's clock read just
    before, also measure its skew (database clock minus host clock) and return it."""
    params = {"cluster": cluster, "instance": instance_id, "local": local_now}
    row = driver(conn).execute(_HEARTBEAT, params).fetchone()
    return None if row is None or local_now is None else row[0]
