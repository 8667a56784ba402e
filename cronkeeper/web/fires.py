"""Expected fires kept between requests, per stored schedule version.

A version's spec never changes once stored (a change is a new version with a new id), so the
fires a version implies are a pure function of its id and the interval asked for. The
schedules page asks, for each of 10,000 schedules, for the fires of the last ~60 periods up to
now; computing them from the trigger on every request was a third of a state filter's time.
``FireCache`` keeps, per version id, the fires of one interval ``[lo, hi]`` (whole Unix
seconds) and answers a request inside it by bisection; a request that reaches past ``hi`` (the
window slid forward with time) computes only the new fires and appends them, and computes
ahead (a window's length, at least an hour: fires are known in advance), so the next requests
usually compute nothing; one that starts
before ``lo`` recomputes the entry. The front is dropped when it grows past what is asked, so
an entry holds about one window. A version change needs no invalidation: the new version has
its own id and the audit asks the old one only for fires up to the new version's start.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from datetime import UTC, datetime

from cronkeeper.audit import fire_seconds
from cronkeeper.timing import Trigger

AHEAD = 3600  # seconds of fires computed past what is asked, at least


def _at(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class FireCache:
    """``audit.FireSource`` with memory: same fires as ``audit.fire_seconds``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[int, int, list[int]]] = {}  # id -> lo, hi, fires
        self.computed = 0  # fires computed from triggers so far (tests read it)

    def __call__(self, version_id: int, trigger: Trigger, after: datetime,
                 upto: datetime) -> list[int]:
        first, last = math.floor(after.timestamp()) + 1, math.floor(upto.timestamp())
        if first > last:
            return []
        with self._lock:
            entry = self._entries.get(version_id)
        if entry is None or first < entry[0]:
            hi = last + max(AHEAD, last - first)
            fires = list(fire_seconds(trigger, _at(first - 1), _at(hi)))
            lo = first
            self.computed += len(fires)
        else:
            lo, hi, fires = entry
            if last > hi:  # computed ahead: the next requests' windows end a little later
                ahead = last + max(AHEAD, last - first)
                added = list(fire_seconds(trigger, _at(hi), _at(ahead)))
                self.computed += len(added)
                start = bisect_left(fires, first)
                if start > len(fires) // 2:  # the window slid: forget what it left behind
                    fires, lo = fires[start:], first
                fires = fires + added  # a new list: a reader may hold the old one
                hi = ahead
        with self._lock:
            self._entries[version_id] = (lo, hi, fires)
        return fires[bisect_left(fires, first):bisect_right(fires, last)]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
