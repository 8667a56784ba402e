"""A won leadership as the leader's work sees it: what the election (``election.Node``) hands
the leader's loop (``leading.LeaderLoop.lead``) each time it wins. The leader's side knows the
election only through this value."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from cronkeeper.db import leadership as dbl
from cronkeeper.db.engine import RawConnection
from cronkeeper.errors import LeadershipLost


def _nothing() -> None:
    pass


@dataclass(frozen=True, slots=True)
class Term:
    """One won leadership, as the election hands it to the leader's loop. ``number`` is the
    fencing token: every write transaction of the term begins with ``confirm``. The loop calls
    ``progress`` after each bounded step of work (the stall watchdog's feed), returns when
    ``stopping`` is set (the election then releases the lock), and raises when the term is lost.
    ``quiet_limit``: the longest the loop may go without a heartbeat or progress before a
    standby (``leader_timeout``) or the watchdog (``stall_timeout``) takes it for stuck."""

    conn: RawConnection
    number: int
    cluster: str
    lock_key: int
    stopping: threading.Event = field(default_factory=threading.Event)
    progress: Callable[[], None] = _nothing
    quiet_limit: float = 10.0

    def confirm(self) -> datetime:
        """Heartbeat; raises LeadershipLost unless we still hold the lock under our term."""
        now = dbl.leadership_confirm(self.conn, self.cluster, self.number, self.lock_key)
        if now is None:
            raise LeadershipLost(f"term {self.number}: the lock or the term is no longer ours")
        return now
