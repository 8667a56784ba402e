"""Instance registry: who runs, where, with which schedule set, and how far its clock is off."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

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


def instances_live(conn: sa.Connection, cluster: str, within_seconds: float = 30.0) -> list[dict]:
    rows = conn.execute(
        sa.select(instances)
        .where(
            instances.c.cluster == cluster,
            instances.c.heartbeat_at
            > sa.func.clock_timestamp() - sa.func.make_interval(0, 0, 0, 0, 0, 0, within_seconds),
        )
        .order_by(instances.c.kind, instances.c.instance_id)
    )
    return [dict(r._mapping) for r in rows]


def instances_forget(conn: sa.Connection, cluster: str, instance_id: str) -> None:
    """A gracefully stopped instance leaves the registry at once (no stale row to explain)."""
    conn.execute(
        sa.update(instances)
        .where(instances.c.cluster == cluster, instances.c.instance_id == instance_id)
        .values(heartbeat_at=sa.func.clock_timestamp() - sa.text("interval '1 day'"))
    )
