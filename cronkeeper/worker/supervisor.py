"""The worker's supervisor thread, until the recorder is done: it extends the leases of the jobs
the worker holds (running, or ended and waiting for the recorder), heartbeats the worker's row
in ``instances``, and times out task handlers (a Python thread cannot be killed: the handler's
thread is abandoned, and too many abandoned ones stop the worker so that its service manager
restarts it)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cronkeeper import clock, metrics
from cronkeeper.db import instances as db_instances
from cronkeeper.db import outbox_claims
from cronkeeper.errors import DatabaseError
from cronkeeper.logs import say_survived
from cronkeeper.outage import Repeats
from cronkeeper.worker.classify import Ending, Kind
from cronkeeper.worker.runtime import Host

log = logging.getLogger("cronkeeper.worker")

EXIT_TOO_MANY_ABANDONED = 75  # EX_TEMPFAIL: the service manager restarts the worker


class Supervisor:
    def __init__(self, worker: Host, replace_runner: Callable[[], None]) -> None:
        self.worker = worker
        self._replace_runner = replace_runner  # a thread for one that was abandoned
        self._unkept: set[int] = set()  # held jobs the last heartbeat could not extend
        self._lost_said: set[tuple[int, int]] = set()  # (job, attempt) whose lost lease was logged
        self.abandoned: list[threading.Thread] = []
        self._repeats = Repeats()  # the unexpected errors it survives, said once a minute

    def loop(self) -> None:
        cfg = self.worker.config
        next_beat = 0.0
        while not self.worker.recorder_done.is_set():
            now = clock.monotonic()
            # Apart: a step that fails on every pass must not keep the other from running (the
            # heartbeat is what keeps the leases; a dead supervisor lets every one lapse).
            try:
                self._time_out_tasks(now)
            except Exception as exc:  # noqa: BLE001
                self._unexpected("timing out handlers", exc, now)
            if now >= next_beat:
                next_beat = now + cfg.heartbeat_interval
                try:
                    self._heartbeat()
                except DatabaseError:
                    next_beat = now + min(cfg.heartbeat_interval, 1.0)
                except Exception as exc:  # noqa: BLE001
                    self._unexpected("extending leases", exc, now)
                    next_beat = now + min(cfg.heartbeat_interval, 1.0)
            self.worker.recorder_done.wait(0.1)

    def _unexpected(self, step: str, exc: Exception, now: float) -> None:
        """Log an error the supervisor survives: with its traceback the first time, then once a
        minute while the same error (its type and the line that raised it) repeats."""
        say_survived(log, self._repeats, "supervisor", step, exc, now)

    def _heartbeat(self) -> None:
        worker = self.worker
        cfg = worker.config
        with worker.lock:
            held = [r.job for r in worker.running.values()]
            held += [r.job for r in worker.recording.values()]
        with worker.db.transaction("extending leases") as conn:
            if held:
                kept = set(outbox_claims.outbox_lease_extend(
                    conn, worker_id=cfg.worker_id, ids=[j.id for j in held],
                    attempts=[j.attempt for j in held], margin=cfg.lease_margin))
                unkept = {j.id for j in held if j.id not in kept}
                for job in held:
                    # Not kept twice in a row: a handler process commits its job's completion
                    # a moment before its runner hears of it, so once proves nothing. Said
                    # once per attempt, not at every heartbeat while the handler runs on.
                    lost = (job.id, job.attempt)
                    if (job.id in unkept and job.id in self._unkept and job.id in worker.running
                            and lost not in self._lost_said):
                        self._lost_said.add(lost)
                        log.warning("lease lost: job=%d key=%s attempt=%d", job.id, job.key, job.attempt, extra={"action": "lease_lost"})
                self._unkept = unkept
                self._lost_said &= {(j.id, j.attempt) for j in held}
            skew = db_instances.instances_heartbeat_holder(conn, cluster=cfg.cluster, instance_id=cfg.worker_id,
                                                   local_now=clock.wall())
            if skew is not None:
                metrics.current().set_skew(skew)

    def _time_out_tasks(self, now: float) -> None:
        worker = self.worker
        with worker.lock:
            late = [r for r in worker.running.values()
                    if r.proc is None and r.job.task != "command"
                    and now > r.deadline + r.timeout_grace]
        for held in late:
            if not held.settle(timed_out=True):
                continue
            if held.thread is not None:
                self.abandoned.append(held.thread)
            self._replace_runner()
            log.error("task timed out: job=%d key=%s attempt=%d timeout=%.1fs: handler "
                      "thread abandoned, attempt recorded as timeout", held.job.id, held.job.key,
                      held.job.attempt, held.job.timeout, extra={"action": "task_timed_out"})
            worker.queue_ending(held, Ending(Kind.TIMEOUT, f"timed out after {held.job.timeout:g}s"))
        self.abandoned = [t for t in self.abandoned if t.is_alive()]
        if len(self.abandoned) >= worker.config.concurrency and not worker.stopping.is_set():
            log.error("too many abandoned handlers: count=%d: stopping so the service "
                      "manager restarts the worker", len(self.abandoned), extra={"action": "too_many_abandoned_handlers"})
            worker.exit_code = EXIT_TOO_MANY_ABANDONED
            worker.stop()
