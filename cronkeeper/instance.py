"""This scheduler instance as the ``instances`` registry shows it (``status``, ``web``): its id,
its heartbeat (which also measures how far this host's clock is from the database's) and its
stop. The election's housekeeping thread beats it; workers and relays register through
``cronkeeper.claiming`` instead."""

from __future__ import annotations

import os
import socket

from cronkeeper import __version__, clock
from cronkeeper.db.engine import Engine
from cronkeeper.db.instances import instances_heartbeat, instances_stopped
from cronkeeper.timing import tzdata_version


def default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


def heartbeat(engine: Engine, *, cluster: str, instance_id: str, leader: bool,
              schedules_digest: str) -> float:
    """Beat once; the clock skew seen: the database's clock minus this host's, in seconds."""
    local = clock.wall()
    with engine.begin() as conn:
        db_now = instances_heartbeat(
            conn, cluster=cluster, instance_id=instance_id, kind="scheduler",
            host=socket.gethostname(), pid=os.getpid(), version=__version__,
            schedules_digest=schedules_digest, tzdata_version=tzdata_version(),
            role="leader" if leader else "standby", local_now=local,
        )
    return (db_now - local).total_seconds()


def record_stopped(engine: Engine, cluster: str, instance_id: str) -> None:
    """Record the instance stopped (best effort: the process is on its way out)."""
    try:
        with engine.begin() as conn:
            instances_stopped(conn, cluster, instance_id)
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass
