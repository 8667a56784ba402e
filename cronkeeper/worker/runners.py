"""The threads that run claimed jobs.

``concurrency`` long-lived threads take jobs from one queue, so handing a job over is a put on a
``SimpleQueue``, not a future and a thread-pool bookkeeping step per job: a batch of fast
handlers runs back to back on a thread while it holds the GIL. A thread whose handler passed its
timeout is abandoned (a Python thread cannot be killed): the supervisor asks for a replacement,
and the abandoned thread exits when its handler finally returns.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable

from cronkeeper import clock
from cronkeeper.worker.runtime import Running

THREAD_PREFIX = "job"  # cli/worker.py looks for live threads of this name at exit


class Runners:
    def __init__(self, size: int, run: Callable[[Running], None]) -> None:
        self._size = size
        self._run = run
        self._queue: queue.SimpleQueue[Running | None] = queue.SimpleQueue()
        self._names = itertools.count()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for _ in range(self._size):
            self.replace()

    def replace(self) -> None:
        """Start one more thread (for one the supervisor abandoned)."""
        thread = threading.Thread(target=self._loop, name=f"{THREAD_PREFIX}_{next(self._names)}",
                                  daemon=True)
        self._threads.append(thread)
        thread.start()

    def submit(self, held: Running) -> None:
        self._queue.put(held)

    def _loop(self) -> None:
        while True:
            held = self._queue.get()
            if held is None:
                return
            self._run(held)
            if held.timed_out:
                return  # abandoned while the handler ran: a replacement took this place

    def stop(self, wait: float = 2.0) -> None:
        """Let idle threads exit (queued jobs are not run); abandoned ones are left behind."""
        alive = [t for t in self._threads if t.is_alive()]
        for _ in alive:
            self._queue.put(None)
        deadline = clock.monotonic() + wait
        for thread in alive:
            thread.join(max(0.0, deadline - clock.monotonic()))
