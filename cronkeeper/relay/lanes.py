"""Each target's calls on a thread of its own, waited for until a deadline (docs/relay.md,
"Failures").

A target's own timeouts bound each socket read, not a whole call: a broker that accepts the
connection and then answers a byte at a time (overloaded, or a proxy in front of it dripping)
kept one publish going for minutes, past the job's lease, so another relay claimed and
republished the job while this relay, deaf to SIGTERM, published nothing else. So the relay
waits for a call only until its deadline (half the batch's lease: the mark still fits in the
other half). A call still running then is abandoned to its thread: its jobs are the target's
failure, not theirs (``TargetUnavailable``: handed back uncounted, the target rests), and the
target takes no other call until that one has ended, however it ends; what it may have
published is republished later under the same target id (at least once). A target can avoid
that where it knows nothing was sent yet: :func:`given_up` tells the call that its caller left
(the Celery target asks it once its connection is finally open, before sending).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from cronkeeper import clock
from cronkeeper.relay.targets.base import TargetUnavailable

T = TypeVar("T")
_current = threading.local()  # on a lane's thread: the running call's "caller gave up" flag


def given_up() -> bool:
    """Whether the relay stopped waiting for the call running on this thread (its deadline
    passed): a target that has sent nothing yet should then send nothing."""
    flag = getattr(_current, "gave_up", None)
    return flag is not None and flag.is_set()


class _Lane:
    """One daemon thread running one target's calls in order (a daemon: a call stuck on a
    dripping socket must not hold the process at exit)."""

    def __init__(self, name: str) -> None:
        self.calls: queue.Queue[tuple[Callable[[], Any], Future[Any], threading.Event] | None] = \
            queue.Queue()
        self.stuck: Future[Any] | None = None  # a call that outlived its deadline, still running
        self.thread = threading.Thread(target=self._run, name=f"relay-target-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.calls.get()
            if item is None:
                return
            call, future, _current.gave_up = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)


class Lanes:
    def __init__(self, names: list[str]) -> None:
        self._lanes = {name: _Lane(name) for name in names}

    def close(self) -> None:
        """End the threads (a stuck one once its call ends)."""
        for lane in self._lanes.values():
            lane.calls.put(None)

    def stuck(self, name: str) -> bool:
        """Whether a call of this target outlived its deadline and is still running."""
        lane = self._lanes[name]
        if lane.stuck is not None and lane.stuck.done():
            lane.stuck = None
        return lane.stuck is not None

    def call(self, name: str, deadline: float, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the target's thread; its result, or its exception, when it ends
        before ``deadline`` (monotonic). Else ``TargetUnavailable``, as it is at once while an
        earlier call of this target is still stuck."""
        if self.stuck(name):
            raise TargetUnavailable(f"target '{name}': an earlier call has not answered yet")
        lane = self._lanes[name]
        future: Future[T] = Future()
        gave_up = threading.Event()
        lane.calls.put((lambda: fn(*args), future, gave_up))
        try:
            return future.result(timeout=max(0.0, deadline - clock.monotonic()))
        except FutureTimeout:
            if future.done():
                raise  # the call's own timeout, raised by the call
            if future.cancel():  # never started (cannot happen while nothing is stuck)
                raise TargetUnavailable(f"target '{name}': no time left to call it") from None
            gave_up.set()
            lane.stuck = future
            raise TargetUnavailable(
                f"target '{name}': no answer within the relay's deadline (half its lease): "
                "the broker accepts the connection but answers too slowly or not at all; "
                "what may have landed is republished later under the same id") from None
