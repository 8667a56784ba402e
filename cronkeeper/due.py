"""The leader's due-queue: schedules filed by their next fire, and the per-pass memo that lets
schedules sharing a trigger and a horizon share its calendar work."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from cronkeeper.timing import Trigger
from cronkeeper.versions import ScheduleState


class DueQueue:
    """Schedules by next fire: one bucket per instant and a heap of the instants. A burst's
    100,000 schedules share an instant, so taking them is a list walk, not 100,000 pops from a
    heap of (instant, name) pairs that compare equal instants, then names."""

    __slots__ = ("_due_at", "_instants")

    def __init__(self) -> None:
        self._due_at: dict[datetime, list[str]] = {}
        self._instants: list[datetime] = []

    def refill(self, states: Mapping[str, ScheduleState], progress: Callable[[], None],
               step: int) -> None:
        """File every schedule of ``states`` under its next fire (set on its state), each
        bucket in name order; ``progress`` every ``step`` schedules (a pass over 100,000 is
        steps too)."""
        self._due_at = {}
        self._instants = []
        next_fire = Memo(lambda trigger, after: trigger.next_fire(after))
        for n, (name, state) in enumerate(states.items(), 1):
            if n % step == 0:
                progress()
            state.next_fire = next_fire(state.trigger, state.after)
            if state.next_fire is not None:
                self._due_at.setdefault(state.next_fire, []).append(name)
        for bucket in self._due_at.values():
            bucket.sort()
        self._instants = list(self._due_at)
        heapq.heapify(self._instants)

    def push(self, when: datetime, name: str) -> None:
        bucket = self._due_at.get(when)
        if bucket is None:
            bucket = self._due_at[when] = []
            heapq.heappush(self._instants, when)
        bucket.append(name)

    def next_due(self) -> datetime | None:
        return self._instants[0] if self._instants else None

    def earliest(self, now: datetime) -> tuple[datetime, list[str]] | None:
        """The earliest bucket due by ``now`` (its instant and names), or None. The caller
        walks the names from the front and says how many it took (``taken``); the rest stay."""
        if self._instants and self._instants[0] <= now:
            when = self._instants[0]
            return when, self._due_at[when]
        return None

    def taken(self, when: datetime, n: int) -> None:
        """The first ``n`` names of the bucket at ``when`` are out of the queue."""
        bucket = self._due_at[when]
        del bucket[:n]
        if not bucket:
            heapq.heappop(self._instants)
            del self._due_at[when]


class Memo:
    """``compute(trigger, after)`` remembered for one pass (a tick, a heap rebuild): schedules
    that share a trigger instance (``make_trigger`` shares them) and a horizon get one answer.
    Keyed by the trigger's identity: the states hold every trigger for the whole pass."""

    __slots__ = ("compute", "seen")

    def __init__(self, compute: Callable[[Trigger, datetime], Any]) -> None:
        self.compute = compute
        self.seen: dict[tuple[int, datetime], Any] = {}

    def __call__(self, trigger: Trigger, after: datetime) -> Any:
        key = (id(trigger), after)
        try:
            return self.seen[key]
        except KeyError:
            value = self.seen[key] = self.compute(trigger, after)
            return value
