"""`leadership_depose_stale` terminates only the backend that leads with a stale heartbeat: never a
newer backend that happens to carry the pid the leadership row recorded (the server reuses pid
numbers, and after a failover or restart they start again)."""

from __future__ import annotations

from datetime import datetime, timedelta

import psycopg
import pytest

from cronkeeper.db import leadership as dbl
from cronkeeper.db.engine import advisory_key, normalize_url
from cronkeeper.db.sessions import backend_pid_now


@pytest.fixture
def sessions(database_url, schema, cluster):
    url = normalize_url(database_url)
    key = advisory_key(f"cronkeeper:{schema}:{cluster}")
    holder = dbl.lock_connect(url, schema, "test-holder")
    standby = dbl.lock_connect(url, schema, "test-standby")
    assert dbl.lock_wait(holder, key)
    yield holder, standby, key
    for conn in (holder, standby):
        conn.close()


def _record(conn: psycopg.Connection, cluster: str, pid: int, since: datetime) -> None:
    """A leadership row naming ``pid``, won at ``since``, whose heartbeat is an hour old."""
    conn.execute(
        """INSERT INTO leadership (cluster, term, instance_id, backend_pid, since, heartbeat_at)
           VALUES (%s, 7, 'vm-old', %s, %s, clock_timestamp() - interval '1 hour')""",
        (cluster, pid, since),
    )


def test_a_stale_leader_is_deposed(sessions, cluster) -> None:
    holder, standby, key = sessions
    pid = backend_pid_now(holder)
    # won after its backend started, silent for an hour: the frozen leader itself
    start = standby.execute("SELECT backend_start FROM pg_stat_activity WHERE pid = %s",
                            (pid,)).fetchone()[0]  # fmt: skip
    _record(standby, cluster, pid, start + timedelta(milliseconds=1))
    assert dbl.leadership_depose_stale(standby, cluster, key, stale_after=10) == pid
    with pytest.raises(psycopg.OperationalError):
        holder.execute("SELECT 1")


def test_a_newer_backend_with_the_recorded_pid_is_left_alone(sessions, cluster) -> None:
    """The row says the leader won an hour ago with this pid; the backend holding the lock under
    that pid started after that, so it is not that leader (a just-won leader after a failover
    whose pid repeats the old one's): it must not be terminated."""
    holder, standby, key = sessions
    pid = backend_pid_now(holder)
    now = standby.execute("SELECT clock_timestamp()").fetchone()[0]
    _record(standby, cluster, pid, now - timedelta(hours=1))
    assert dbl.leadership_depose_stale(standby, cluster, key, stale_after=10) is None
    assert holder.execute("SELECT 1").fetchone() == (1,)
    assert dbl.lock_holder_pid(standby, key) == pid
