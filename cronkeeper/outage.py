"""Saying that the database is away without flooding the log (SPEC §10: every process "says
what is wrong (once a minute, not in a flood)"), and the errors a thread survives
(``Repeats``). Pure: the caller passes the time (monotonic seconds) and logs what it is told
to; no clock, no logging, no I/O here.

One ``OutageReport`` per thing that can find the database away (the daemon's session loop, a
worker's or relay's database seam, the wait at start). A problem's kind is its message with the
numbers taken out (``kind_of``): "too many clients already" is one kind, "terminating connection
due to administrator command" another. The rule:

- the first failure of an outage is said at once;
- a failure of a kind said less than ``every`` seconds ago is counted, silently;
- a failure of a kind not said yet in this outage, or said ``every`` seconds ago or more, is
  said, with how long the outage has lasted and how many failures it has seen;
- the first success after a failure ends the outage, and is said, with how long it lasted and
  how many failures it saw.

So a process says what is wrong when it begins, when it changes, and once a minute while it
lasts, never once per retry. Not thread-safe: a caller shared by threads holds its own lock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

EVERY = 60.0  # seconds between two lines about the same kind of problem

_NUMBERS = re.compile(r"\d+")


def kind_of(message: str) -> str:
    """The kind of problem a message names: the message without its numbers (ports, process
    ids, durations), so two tries that failed the same way are one kind."""
    return _NUMBERS.sub("#", message)


@dataclass(frozen=True, slots=True)
class Notice:
    """What to say: ``first`` for the outage's opening line (False for a later line or the
    recovery), ``lasted`` seconds since its first failure, ``failures`` in it so far (the one
    being said included)."""

    first: bool
    lasted: float
    failures: int


class OutageReport:
    def __init__(self, every: float = EVERY) -> None:
        self.every = every
        self._since: float | None = None  # the outage's first failure
        self._said: dict[str, float] = {}  # kind -> when it was last said, in this outage
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, now: float, kind: str = "") -> Notice | None:
        """A failure of ``kind`` at ``now``: the notice to say, or None to count it silently."""
        self._failures += 1
        if self._since is None:
            self._since = now
            self._said = {kind: now}
            return Notice(first=True, lasted=0.0, failures=self._failures)
        said = self._said.get(kind)
        if said is not None and now - said < self.every:
            return None
        self._said[kind] = now
        return Notice(first=False, lasted=now - self._since, failures=self._failures)

    def recovered(self, now: float) -> Notice | None:
        """A success at ``now``: the notice that the outage is over, or None if there was none."""
        if self._since is None:
            return None
        notice = Notice(first=False, lasted=now - self._since, failures=self._failures)
        self._since, self._said, self._failures = None, {}, 0
        return notice


class Repeats:
    """Errors a thread survives and goes on after (a bug, most likely), said without flooding:
    each one the first time with its traceback, then once every ``every`` seconds while the
    same error recurs. The same error: the same step, type and line that raised it
    (``where``), whatever its message (which may hold ids or times). Pure and not thread-safe,
    as ``OutageReport``: one per thread that survives errors (the worker's supervisor, the
    daemon's housekeeping)."""

    def __init__(self, every: float = EVERY) -> None:
        self.every = every
        self._seen: dict[tuple[str, str, str], tuple[float, float, int]] = {}  # first, said, n

    def failed(self, step: str, exc: BaseException, now: float) -> Notice | None:
        """``exc`` raised by ``step`` at ``now``: the notice to say (``first``: with the
        traceback), or None to count it silently."""
        key = (step, type(exc).__name__, where(exc))
        first_at, said_at, count = self._seen.get(key, (now, -self.every, 0))
        count += 1
        if now - said_at < self.every:
            self._seen[key] = (first_at, said_at, count)
            return None
        self._seen[key] = (first_at, now, count)
        return Notice(first=count == 1, lasted=now - first_at, failures=count)


def where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc``'s traceback ('' without one)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else ""
