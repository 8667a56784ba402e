"""Who leads the cluster now: one reading for ``status`` and every page of ``web``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from cronkeeper.db.engine import translate_errors
from cronkeeper.db.leadership import leadership_current

if TYPE_CHECKING:
    from cronkeeper.db.engine import Engine

# A leader whose heartbeat is older than this is not counted as leading (``--leader-timeout``).
DEFAULT_LEADER_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class LastLeader:
    instance_id: str
    term: int
    since: datetime
    heartbeat_age: float
    released_at: datetime | None


def leads(row: dict[str, Any] | None, leader_timeout: float = DEFAULT_LEADER_TIMEOUT) -> bool:
    """A leadership row counts as a live leader: not released, heartbeat recent."""
    return bool(row and row["released_at"] is None and row["heartbeat_age"] <= leader_timeout)


def last_leader(row: dict[str, Any] | None) -> LastLeader | None:
    if row is None:
        return None
    return LastLeader(row["instance_id"], row["term"], row["since"], row["heartbeat_age"],
                      row["released_at"])


def leaderless(engine: Engine, cluster: str,
               leader_timeout: float = DEFAULT_LEADER_TIMEOUT) -> tuple[bool, LastLeader | None]:
    """(True when no instance leads now, the last leader the cluster had)."""
    with translate_errors("reading the leader"), engine.connect() as conn:
        row = leadership_current(conn, cluster)
        conn.rollback()
    return not leads(row, leader_timeout), last_leader(row)
