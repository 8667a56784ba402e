"""Worker plumbing: configuration, the jobs a worker holds, and database access that survives
the database going away (reconnect with backoff, log it, resume)."""

from __future__ import annotations

import logging
import queue
import random
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cronkeeper.claiming import ClaimingDatabase, SchemaFeature
from cronkeeper.db.engine import Engine
from cronkeeper.db.outbox_claims import OutboxJob
from cronkeeper.output import Capture
from cronkeeper.schedule.model import DEFAULT_OUTPUT_LIMIT, ScheduleSpec
from cronkeeper.worker.classify import Ending
from cronkeeper.worker.context import JobContext

log = logging.getLogger("cronkeeper.worker")


@dataclass
class WorkerConfig:
    worker_id: str
    cluster: str = "default"
    schema: str = "cronkeeper"
    concurrency: int = 10
    batch_size: int = 250
    tasks: list[str] | None = None
    schedules: list[str] | None = None
    limits: dict[str, int] = field(default_factory=dict)
    lease_margin: float = 30.0  # lease = job timeout + margin; heartbeats keep it ahead by margin
    poll_interval: float = 1.0
    drain_timeout: float = 30.0
    kill_grace: float = 2.0
    defer_delay: float = 15.0  # a job waiting for this worker's schedule version comes back after
    isolation: str = "thread"  # thread | process (--isolation): where task handlers run
    max_jobs_per_child: int = 1000  # process isolation: a child is recycled after this many
    max_child_memory_mb: int = 512  # ... or once its resident memory passes this
    imports: list[str] = field(default_factory=list)  # --import modules (children import them)
    specs: dict[str, ScheduleSpec] = field(default_factory=dict)
    schedules_digest: str = ""
    version: str = ""
    # Bytes of output kept per attempt of a job that names no schedule version (enqueued
    # jobs): --output-limit. 0 keeps nothing. Schedules keep their own (job_versions.py).
    output_limit: int = DEFAULT_OUTPUT_LIMIT

    @property
    def heartbeat_interval(self) -> float:
        return max(0.2, min(5.0, self.lease_margin / 3))

    @property
    def reap_interval(self) -> float:
        return max(0.2, min(5.0, self.lease_margin / 2))


@dataclass(eq=False)
class Running:
    """A job this worker holds, from claim until its ending is recorded in the database (its
    thread is free once the ending is queued; ``ended`` says when that was, monotonic)."""

    job: OutboxJob
    started: float = 0.0
    deadline: float = float("inf")
    ctx: JobContext | None = None
    proc: subprocess.Popen | None = None
    thread: threading.Thread | None = None
    done: bool = False
    timed_out: bool = False
    released: bool = False
    ended: float = 0.0
    timeout_grace: float = 0.0  # the supervisor times it out this long after its deadline
    capture: Capture | None = None  # what the attempt printed (None: nothing kept, or not yet)
    # A handler in this process (``keep_records``): its records' lines, appended by
    # ``logcapture`` without a call into this object (each costs a frame per record); a
    # ``Capture`` is made only when they pass ``spill_at`` characters (``spill``).
    # ``output_limit`` 0: no records kept (a command, a handler process, or output_limit 0).
    # ``spill_at`` -1: the output was taken (``output``), later records are dropped.
    lines: list[str] = field(default_factory=list)
    pending: int = 0  # about how many characters ``lines`` holds (a trigger, not a count)
    spill_at: int = 0
    output_limit: int = 0  # the bytes a handler's records may keep
    _kept: bytes | None = None  # the output, once taken
    lock: threading.Lock = field(default_factory=threading.Lock)

    def keep_records(self, limit: int) -> None:
        """This job's handler runs in this process: keep its records, up to ``limit`` bytes."""
        self.output_limit = self.spill_at = limit

    def spill(self) -> None:
        """The lines passed ``spill_at``: fold them into the capture (made now), so that memory
        stays within about twice the limit however much the handler logs; once the output was
        taken, drop them (an abandoned handler logging on).

        Only if the job's lock is free: a record emitted while this thread holds it (a
        finalizer that logs, run by a garbage collection under the lock) must not wait for
        itself, and another thread holding it is folding or ending anyway. The lines stay
        for the next record's spill or for ``output``, which takes them all."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            lines = self.lines
            self.pending = 0
            n = len(lines)  # a line another thread appends meanwhile stays for the next fold
            chunk = "".join(lines[:n])
            del lines[:n]
            if self.spill_at < 0:
                return
            if self.capture is None:
                self.capture = Capture(self.output_limit)
            self.capture.feed(chunk.encode("utf-8", "replace"))
        finally:
            self.lock.release()

    def output(self) -> bytes | None:
        """What the attempt printed, final from the first call (later lines are not kept)."""
        with self.lock:
            lines, capture = self.lines, self.capture
            if self.output_limit <= 0:  # a command, a handler process, or nothing kept
                return capture.close() if capture is not None else None
            if self.spill_at < 0:
                return self._kept
            self.spill_at = -1
            self.lines = []  # where a record still arriving goes, to be dropped at its spill
            data = "".join(lines).encode("utf-8", "replace")
            if capture is None:
                if len(data) <= self.output_limit:  # the usual case: one join, one encoding
                    self._kept = data
                    return data
                capture = self.capture = Capture(self.output_limit)
            capture.feed(data)
            self._kept = capture.close()
            return self._kept

    def settle(self, *, timed_out: bool = False) -> bool:
        """Claim the right to record this job's ending (once: worker, watchdog or drain).
        ``timed_out`` is set under the same lock, so the job's thread, when its handler
        finally returns and cannot settle, knows it was abandoned."""
        with self.lock:
            if self.done:
                return False
            self.done = True
            self.timed_out = timed_out
            return True


class Ahead:
    """How many jobs to claim beyond the free threads, so that a stream of fast handlers costs
    one claim statement per batch rather than one per handful of jobs.

    As many as the threads are expected to *start* within ``HORIZON`` seconds, judged by a
    moving average of recent handler durations, capped at the batch size: ``batch_size`` for
    handlers that take a millisecond, none for handlers that take ``HORIZON`` or more. None
    before the first handler finished, and none while any handler has been running longer
    than ``STUCK`` seconds: a job is never held waiting behind slow ones while other workers
    could run it. A job claimed ahead holds its lease (heartbeats extend it) and its attempt
    row, whose ``started_at`` is the claim."""

    HORIZON = 0.1
    STUCK = 1.0
    WEIGHT = 0.05  # of the newest duration in the moving average

    def __init__(self, concurrency: int, batch_size: int) -> None:
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.mean: float | None = None

    def observe(self, seconds: float) -> None:
        mean = self.mean
        self.mean = seconds if mean is None else mean + self.WEIGHT * (seconds - mean)

    def extra(self, longest_running: float) -> int:
        mean = self.mean
        if mean is None or mean >= self.HORIZON or longest_running > self.STUCK:
            return 0
        return min(self.batch_size, int(self.concurrency * self.HORIZON / max(mean, 1e-6)))


class HandlerProcesses(Protocol):
    """The pool of handler processes (``pool.ProcessPool``), as ``execute`` uses it."""

    def run(self, held: Running, end_session: Callable[[int], None]) -> Ending | str:
        """Run the job in a child: an Ending, or the child's own commit (committed | lost)."""


class VersionsKnown(Protocol):
    """What the worker knows of its jobs' schedule versions (``job_versions.JobVersions``)."""

    digests: dict[int, str]

    def output_limit(self, job: OutboxJob) -> int: ...

    def remember_digest(self, version_id: int, digest: str) -> None: ...


class Host(Protocol):
    """What the leaf modules (execute, recorder, supervisor) use of the worker that runs them:
    the loop's ``Worker`` provides it, and they import this instead of the loop (no import
    circle)."""

    config: WorkerConfig
    engine: Engine
    db: ClaimingDatabase
    endings: queue.SimpleQueue[tuple[Running, object]]
    stats: dict[str, int]
    rand: random.Random
    recorder_done: threading.Event
    stopping: threading.Event
    drain_deadline: float | None
    exit_code: int
    lock: threading.Lock  # guards running and recording
    running: dict[int, Running]
    recording: dict[tuple[int, int], Running]
    output_column: SchemaFeature

    @property
    def versions(self) -> VersionsKnown:
        """Read-only here, as ``pool`` is."""

    @property
    def pool(self) -> HandlerProcesses:
        """Read-only here, so that the loop's ``ProcessPool`` satisfies it (a settable protocol
        attribute would have to be declared as exactly ``HandlerProcesses``)."""

    def forget(self, held: Running) -> None:
        """The job is no longer held: it was handed back, or its ending recorded otherwise."""

    def queue_ending(self, held: Running, ending: Ending) -> None:
        """The job's thread is done with it: its ending goes to the recorder, and its lease is
        kept (heartbeated) until ``recorded`` says the ending is in the database."""

    def recorded(self, helds: list[Running]) -> None:
        """These endings are in the database (or the fence refused them): let the jobs go."""

    def stop(self, *, immediate: bool = False) -> None:
        """Stop claiming and drain (at once when ``immediate``)."""
