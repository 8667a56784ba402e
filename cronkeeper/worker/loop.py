"""The worker: claim in batches, run on a thread pool, record endings in batches.

Threads:
- the claim loop (``run``): reaps expired leases, claims up to the free slots (per-task limits
  and serial schedules apart), hands jobs to the pool; on SIGTERM it stops claiming and drains;
- pool threads run one job each (a handler, or a command child process they wait on);
- the recorder batches endings: successes in one fenced UPDATE over unnest arrays, failures in
  another; kept in memory while the database is away and written, with the instant each
  attempt ended, as soon as it answers again (a job stays held, its lease heartbeated, until
  its ending is recorded: ``queue_ending`` and ``recorded``);
- the supervisor extends the leases of held jobs (heartbeat), times out task handlers, and
  heartbeats the worker's row in ``instances``;
- the listener (``wakeups.py``) LISTENs for the schema's wake-ups and pokes the claim loop.

When a claim comes back short the loop sleeps until a wake-up, the earliest ``run_after`` of a
job not due yet, or the poll interval, whichever comes first.
"""

from __future__ import annotations

import logging
import queue
import random
import socket
import threading

from cronkeeper import clock, metrics
from cronkeeper.claiming import RECONNECT_CAP, ClaimingDatabase, ReconnectBackoff, SchemaFeature
from cronkeeper.db import instances as db_instances
from cronkeeper.db import outbox_claims as db
from cronkeeper.db.attempts import attempts_output_column
from cronkeeper.db.engine import Connection, Engine, serial_lock_key
from cronkeeper.errors import DatabaseError
from cronkeeper.worker import logcapture
from cronkeeper.worker.classify import Ending, Kind
from cronkeeper.worker.execute import account_commit, execute
from cronkeeper.worker.pool import ProcessPool
from cronkeeper.worker.recorder import record_loop
from cronkeeper.worker.runners import Runners
from cronkeeper.worker.runtime import Ahead, Running, WorkerConfig
from cronkeeper.worker.wakeups import Wakeups

log = logging.getLogger("cronkeeper.worker")


class Worker:
    def __init__(self, engine: Engine, config: WorkerConfig) -> None:
        self.config = config
        self.db = ClaimingDatabase(engine)
        self.engine = engine
        self.running: dict[int, Running] = {}
        # Jobs whose ending is queued or kept by the recorder, not yet in the database: their
        # threads are free, their leases still heartbeated (by (id, attempt)).
        self.recording: dict[tuple[int, int], Running] = {}
        self._lock = threading.Lock()
        self.endings: queue.SimpleQueue[tuple[Running, object]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self.drain_deadline: float | None = None
        self._wake = threading.Event()
        self._notified = threading.Event()  # a wake-up came: claim as soon as there is room
        self._next_due: float | None = None  # seconds to the earliest job not due yet
        self.ahead = Ahead(config.concurrency, config.batch_size)
        self._capacity = config.concurrency  # threads + jobs claimed ahead (set by each claim)
        self._wake_below = -1  # _let_go() wakes the claim loop when fewer jobs are held
        self.wakeups = Wakeups(engine, config.schema, config.poll_interval, self.notify,
                               self._stopping)
        self.recorder_done = threading.Event()
        self._runners = Runners(config.concurrency, self._execute)
        self.pool = ProcessPool(config, engine, self.db.notes)  # --isolation process, @task(isolation=...)
        self._unkept: set[int] = set()  # held jobs the last heartbeat could not extend
        self._lost_said: set[tuple[int, int]] = set()  # (job, attempt) whose lost lease was logged
        self.rand = random.Random()
        self._next_serial = 0.0
        self.abandoned: list[threading.Thread] = []
        self.exit_code = 0
        self.stats = {"claimed": 0, "succeeded": 0, "failed": 0, "lost": 0}
        # Does the schema keep attempts' output (migrations/0010)?
        self.output_column = SchemaFeature(attempts_output_column)

    # -- control ---------------------------------------------------------------------------

    def stop(self, *, immediate: bool = False) -> None:
        """Stop claiming; running jobs get ``drain_timeout`` (none when ``immediate``)."""
        now = clock.monotonic()
        limit = now if immediate else now + self.config.drain_timeout
        if self.drain_deadline is None or limit < self.drain_deadline:
            self.drain_deadline = limit
        if not self._stopping.is_set():
            log.info("drain started: worker=%s running=%d", self.config.worker_id, len(self.running), extra={"action": "drain_started"})
        self._stopping.set()
        self._wake.set()

    def notify(self) -> None:
        """A wake-up: jobs became available (called by the listener thread)."""
        self._notified.set()
        self._wake.set()

    # -- main loop -------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.config
        self._register_until_up()
        self.db.until_done("reading the schema", self._stopping, self._read_schema)
        logcapture.install()
        recorder = threading.Thread(target=record_loop, args=(self,), name="recorder", daemon=True)
        supervisor = threading.Thread(target=self._supervise_loop, name="supervisor", daemon=True)
        if cfg.isolation == "process":
            self.pool.start()
        self._runners.start()
        recorder.start()
        supervisor.start()
        self.wakeups.start()
        log.info("worker started: worker=%s concurrency=%d isolation=%s", cfg.worker_id,
                 cfg.concurrency, cfg.isolation, extra={"action": "worker_started"})
        backoff = ReconnectBackoff(cap=RECONNECT_CAP)
        next_reap = 0.0
        while not self._stopping.is_set():
            try:
                if clock.monotonic() >= next_reap:
                    self.db.reap_expired(log, restart_grace=cfg.lease_margin)
                    next_reap = clock.monotonic() + cfg.reap_interval
                full = self._claim_round()
                backoff.reset()
            except DatabaseError:
                self._stopping.wait(backoff.next())
                continue
            self._await_room(full)
        self._drain()
        self.endings.put((None, None))  # type: ignore[arg-type]
        self.recorder_done.wait(max(5.0, cfg.drain_timeout))
        self.db.close_kept()
        self.pool.stop()
        self._runners.stop()
        log.info("worker stopped: worker=%s stats=%s", cfg.worker_id, self.stats, extra={"action": "worker_stopped"})
        return self.exit_code

    def _read_schema(self, conn: Connection) -> None:
        self.output_column.check(conn)
        self.db.notes.check(conn)

    def _await_room(self, full: bool) -> None:
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
            self._wake.wait(remaining)
            self._wake.clear()

    def _register_until_up(self) -> None:
        from cronkeeper.timing.zones import tzdata_version

        cfg = self.config
        self.db.until_done("registering the worker", self._stopping,
                           lambda conn: db_instances.instances_register_holder(
                               conn, cluster=cfg.cluster, instance_id=cfg.worker_id,
                               host=socket.gethostname(), pid=_pid(), version=cfg.version,
                               schedules_digest=cfg.schedules_digest,
                               tzdata_version=tzdata_version()))

    def _threshold(self) -> int:
        return max(1, min(self.config.batch_size, self._capacity) // 2)

    def _free(self) -> int:
        backlog = self.endings.qsize()
        if backlog > 4 * self.config.batch_size:
            return 0
        return self._capacity - len(self.running)

    def _claim_round(self) -> bool:
        """Claim what fits; True when a claim came back full (more is probably waiting)."""
        cfg = self.config
        if self._free() <= 0:
            return True  # no room: wait for it (the loop is woken when there is)
        self._notified.clear()  # this claim answers every wake-up heard so far
        now = clock.monotonic()
        with self._lock:
            per_task: dict[str, int] = {}
            longest = 0.0
            for r in self.running.values():
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
            jobs = db.outbox_claim(
                conn, worker_id=cfg.worker_id, limit=want, lease_margin=cfg.lease_margin,
                tasks=cfg.tasks, schedules=cfg.schedules, exclude_tasks=limited,
            )
        self._start(jobs)
        full = len(jobs) == want
        self._next_due = None
        if not full:
            with self.db.statement("finding the next due job") as conn:
                self._next_due = db.outbox_next_due(conn, tasks=cfg.tasks, schedules=cfg.schedules)
        for name in limited:
            room = min(cfg.limits[name] - per_task.get(name, 0), self._free())
            if room <= 0 or (cfg.tasks is not None and name not in cfg.tasks):
                continue
            with self.db.statement("claiming jobs") as conn:
                jobs = db.outbox_claim(
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
            names = db.outbox_serial_candidates(
                conn, limit=free, tasks=cfg.tasks, schedules=cfg.schedules, exclude_tasks=full_tasks
            )
        for name in names:
            if self._free() <= 0:
                return
            key = serial_lock_key(cfg.schema, name)
            with self.db.transaction("claiming a serial job") as conn:
                job = db.outbox_claim_serial(
                    conn, schedule=name, lock_key=key, worker_id=cfg.worker_id,
                    lease_margin=cfg.lease_margin,
                )
            if job is not None:
                self._start([job])

    def _start(self, jobs: list[db.OutboxJob]) -> None:
        if not jobs:
            return
        helds = [Running(job) for job in jobs]
        with self._lock:
            for held in helds:
                self.running[held.job.id] = held
        self.stats["claimed"] += len(helds)
        for held in helds:
            self._runners.submit(held)

    def _execute(self, held: Running) -> None:
        if held.done:
            return  # released by the drain before a thread took it
        held.thread = threading.current_thread()
        held.started = clock.monotonic()
        held.deadline = held.started + held.job.timeout
        metrics.current().job_started(held.job.schedule, held.job.owner)
        ending = execute(self, held)
        self.ahead.observe(clock.monotonic() - held.started)
        if ending is None or not held.settle():
            if held.ctx is not None:
                held.ctx.finish(commit=False)
            return
        try:
            self._finish(held, ending)
        except Exception as exc:  # noqa: BLE001 - never leave a job held (and heartbeated) forever
            # Ending the job raised before its ending reached the recorder (a rollback hook of
            # the handler's own, say): the attempt is recorded as failed; the job runs again.
            log.error("recording the end of job=%d key=%s failed: %s; the attempt is recorded "
                      "as failed", held.job.id, held.job.key, exc, extra={"action": "internal_error"})
            self.queue_ending(held, Ending(Kind.RETRYABLE, f"internal error ending the job: {exc}"))

    def _finish(self, held: Running, ending: Ending) -> None:
        """Queue a job's ending for the recorder (a handler's transaction commits here)."""
        ctx = held.ctx
        if ctx is not None and ctx.in_transaction:
            if ending.kind is Kind.SUCCEEDED:
                failed = self._commit_with_completion(held)
                if failed is None:
                    return
                ending = failed
            else:
                ctx.finish(commit=False)
        self.queue_ending(held, ending)

    def _commit_with_completion(self, held: Running) -> Ending | None:
        """None once accounted for (committed, or refused: lease lost); else the failure."""
        ctx = held.ctx
        assert ctx is not None
        try:
            committed = ctx.complete(self.config.worker_id, output=held.output(),
                                     keep_output=self.output_column.present)
        except Exception as exc:  # noqa: BLE001 - the commit failed: the attempt failed
            ctx.finish(commit=False)
            return Ending(Kind.RETRYABLE, f"committing the job's transaction failed: {exc}")
        account_commit(self, held, committed=committed)
        return None

    def forget(self, held: Running) -> None:
        """The job is no longer held: handed back, or its ending recorded by its own commit."""
        with self._lock:
            self.running.pop(held.job.id, None)
            held_now = len(self.running)
        self._let_go(held_now)

    def queue_ending(self, held: Running, ending: Ending) -> None:
        """Hand the ending to the recorder; the job's thread is free, its lease kept (the
        heartbeat extends it) until ``recorded``, so an ending kept while the database is away
        is not lost to the reaper, and the job not run again, when it answers again."""
        held.ended = clock.monotonic()
        held.output()  # what it printed until now (an abandoned handler may log on)
        with self._lock:
            self.running.pop(held.job.id, None)
            self.recording[(held.job.id, held.job.attempt)] = held
            held_now = len(self.running)
        self.endings.put((held, ending))
        self._let_go(held_now)

    def recorded(self, helds: list[Running]) -> None:
        with self._lock:
            for held in helds:
                self.recording.pop((held.job.id, held.job.attempt), None)

    def _let_go(self, held_now: int) -> None:
        if (held_now <= self._wake_below or self._stopping.is_set()) and not self._wake.is_set():
            self._wake.set()  # room for a batch (waking the loop per job costs a thread switch)

    # -- supervisor -------------------------------------------------------------------------

    def _supervise_loop(self) -> None:
        cfg = self.config
        next_beat = 0.0
        while not self.recorder_done.is_set():
            now = clock.monotonic()
            self._time_out_tasks(now)
            if now >= next_beat:
                next_beat = now + cfg.heartbeat_interval
                try:
                    self._heartbeat()
                except DatabaseError:
                    next_beat = now + min(cfg.heartbeat_interval, 1.0)
            self.recorder_done.wait(0.1)

    def _heartbeat(self) -> None:
        cfg = self.config
        with self._lock:
            held = [r.job for r in self.running.values()]
            held += [r.job for r in self.recording.values()]
        with self.db.transaction("extending leases") as conn:
            if held:
                kept = set(db.outbox_lease_extend(conn, worker_id=cfg.worker_id, ids=[j.id for j in held],
                                           attempts=[j.attempt for j in held], margin=cfg.lease_margin))
                unkept = {j.id for j in held if j.id not in kept}
                for job in held:
                    # Not kept twice in a row: a handler process commits its job's completion
                    # a moment before its runner hears of it, so once proves nothing. Said
                    # once per attempt, not at every heartbeat while the handler runs on.
                    lost = (job.id, job.attempt)
                    if (job.id in unkept and job.id in self._unkept and job.id in self.running
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
        with self._lock:
            late = [r for r in self.running.values()
                    if r.proc is None and r.job.task != "command"
                    and now > r.deadline + r.timeout_grace]
        for held in late:
            if not held.settle(timed_out=True):
                continue
            if held.thread is not None:
                self.abandoned.append(held.thread)
            self._runners.replace()
            log.error("task timed out: job=%d key=%s attempt=%d timeout=%.1fs: handler "
                      "thread abandoned, attempt recorded as timeout", held.job.id, held.job.key,
                      held.job.attempt, held.job.timeout, extra={"action": "task_timed_out"})
            self.queue_ending(held, Ending(Kind.TIMEOUT, f"timed out after {held.job.timeout:g}s"))
        self.abandoned = [t for t in self.abandoned if t.is_alive()]
        if len(self.abandoned) >= self.config.concurrency and not self._stopping.is_set():
            log.error("too many abandoned handlers: count=%d: stopping so the service "
                      "manager restarts the worker", len(self.abandoned), extra={"action": "too_many_abandoned_handlers"})
            self.exit_code = 75
            self.stop()

    # -- drain ------------------------------------------------------------------------------

    def _drain(self) -> None:
        deadline = self.drain_deadline or clock.monotonic()
        while self.running and clock.monotonic() < deadline:
            self._wake.wait(0.05)
            self._wake.clear()
        with self._lock:
            rest = list(self.running.values())
        for held in rest:
            if not held.settle():
                continue
            held.released = True
            if held.proc is not None:
                from cronkeeper.worker.commands import kill_group

                kill_group(held.proc, 0.0)
            log.warning("job released: job=%d key=%s attempt=%d", held.job.id, held.job.key,
                        held.job.attempt, extra={"action": "job_released"})
            self.queue_ending(held, Ending(Kind.RETRYABLE, "released: worker stopped before "
                                           "the job finished (drain timeout)"))


def _pid() -> int:
    import os

    return os.getpid()
