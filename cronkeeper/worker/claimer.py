"""What the worker's claim loop takes, and when: up to the free slots in one batch (per-task
limits and serial schedules apart), then a wait for room, a wake-up or the next due job.

The slots are the threads plus the jobs claimed ahead of them (``runtime.Ahead``). A claim that
comes back full means more is waiting: the loop then waits for room for a good batch (one
statement per job would cap throughput). A short claim waits for a wake-up (``notify``), the
earliest ``run_after`` of a job not due yet, or the poll interval, whichever comes first.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from cronkeeper import clock
from cronkeeper.claiming import ClaimingDatabase
from cronkeeper.db import outbox_claims
from cronkeeper.db.engine import serial_lock_key
from cronkeeper.db.outbox_claims import OutboxJob
from cronkeeper.worker.runtime import Ahead, Running, WorkerConfig


class Claimer:
    """The claim loop's side of the worker: it reads the jobs held (``running``, under
    ``lock``) and the recorder's backlog (``endings``), and hands what it claims to ``start``."""

    def __init__(self, config: WorkerConfig, db: ClaimingDatabase, *,
                 running: dict[int, Running], lock: threading.Lock,
                 endings: queue.SimpleQueue[tuple[Running, object]],
                 start: Callable[[list[OutboxJob]], None], stopping: threading.Event) -> None:
        self.config = config
        self.db = db
        self._running = running
        self._lock = lock
        self._endings = endings
        self._start = start
        self._stopping = stopping
        self.wake = threading.Event()  # the claim loop's (and the drain's) wait ends
        self._notified = threading.Event()  # a wake-up came: claim as soon as there is room
        self._next_due: float | None = None  # seconds to the earliest job not due yet
        self.ahead = Ahead(config.concurrency, config.batch_size)
        self._capacity = config.concurrency  # threads + jobs claimed ahead (set by each claim)
        self._wake_below = -1  # let_go() wakes the claim loop when fewer jobs are held
        self._next_serial = 0.0

    def notify(self) -> None:
        """A wake-up: jobs became available (called by the listener thread)."""
        self._notified.set()
        self.wake.set()

    def let_go(self, held_now: int) -> None:
        """A job is no longer held (``held_now`` are): wake the claim loop if there is room."""
        if (held_now <= self._wake_below or self._stopping.is_set()) and not self.wake.is_set():
            self.wake.set()  # room for a batch (waking the loop per job costs a thread switch)

    def await_room(self, full: bool) -> None:
        """Wait before the next claim: for room for a good batch when jobs are waiting (one
        statement per job would cap throughput); else for a wake-up, the next job's
        ``run_after`` or the poll interval."""
        cfg = self.config
        threshold = self._threshold()
        self._wake_below = self._capacity - threshold if full else -1
        wait = cfg.poll_interval
        if not full and self._next_due is not None:
            wait = min(wait, max(0.0, self._next_due))
        deadline = clock.monotonic() + wait
        while not self._stopping.is_set():
            free = self._free()
            if not full and free > 0 and self._notified.is_set():
                return  # (while jobs wait, a claim takes a batch when there is room for one)
            if full and free >= threshold:
                return
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return
            self.wake.wait(remaining)
            self.wake.clear()

    def _threshold(self) -> int:
        return max(1, min(self.config.batch_size, self._capacity) // 2)

    def _free(self) -> int:
        backlog = self._endings.qsize()
        if backlog > 4 * self.config.batch_size:
            return 0
        return self._capacity - len(self._running)

    def claim_round(self) -> bool:
        """Claim what fits; True when a claim came back full (more is probably waiting)."""
        cfg = self.config
        if self._free() <= 0:
            return True  # no room: wait for it (the loop is woken when there is)
        self._notified.clear()  # this claim answers every wake-up heard so far
        now = clock.monotonic()
        with self._lock:
            per_task: dict[str, int] = {}
            longest = 0.0
            for r in self._running.values():
                per_task[r.job.task] = per_task.get(r.job.task, 0) + 1
                if r.started and now - r.started > longest:
                    longest = now - r.started
        self._capacity = cfg.concurrency + self.ahead.extra(longest)
        free = self._free()
        if free <= 0:
            return True
        limited = list(cfg.limits)
        full_tasks = [t for t in limited if per_task.get(t, 0) >= cfg.limits[t]]
        want = min(free, cfg.batch_size)
        full = False
        with self.db.statement("claiming jobs") as conn:
            jobs = outbox_claims.outbox_claim(
                conn, worker_id=cfg.worker_id, limit=want, lease_margin=cfg.lease_margin,
                tasks=cfg.tasks, schedules=cfg.schedules, exclude_tasks=limited,
            )
        self._start(jobs)
        full = len(jobs) == want
        self._next_due = None
        if not full:
            with self.db.statement("finding the next due job") as conn:
                self._next_due = outbox_claims.outbox_next_due(conn, tasks=cfg.tasks,
                                                               schedules=cfg.schedules)
        for name in limited:
            room = min(cfg.limits[name] - per_task.get(name, 0), self._free())
            if room <= 0 or (cfg.tasks is not None and name not in cfg.tasks):
                continue
            with self.db.statement("claiming jobs") as conn:
                jobs = outbox_claims.outbox_claim(
                    conn, worker_id=cfg.worker_id, limit=room, lease_margin=cfg.lease_margin,
                    tasks=[name], schedules=cfg.schedules,
                )
            self._start(jobs)
        if clock.monotonic() >= self._next_serial:
            self._next_serial = clock.monotonic() + min(cfg.poll_interval, 1.0)
            self._claim_serial(full_tasks)
        return full

    def _claim_serial(self, full_tasks: list[str]) -> None:
        cfg = self.config
        free = self._free()
        if free <= 0:
            return
        with self.db.transaction("finding serial jobs") as conn:
            names = outbox_claims.outbox_serial_candidates(
                conn, limit=free, tasks=cfg.tasks, schedules=cfg.schedules, exclude_tasks=full_tasks
            )
        for name in names:
            if self._free() <= 0:
                return
            key = serial_lock_key(cfg.schema, name)
            with self.db.transaction("claiming a serial job") as conn:
                job = outbox_claims.outbox_claim_serial(
                    conn, schedule=name, lock_key=key, worker_id=cfg.worker_id,
                    lease_margin=cfg.lease_margin,
                )
            if job is not None:
                self._start([job])
