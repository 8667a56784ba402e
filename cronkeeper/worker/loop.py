"""The worker: claim in batches, run on a thread pool, record endings in batches.

Threads:
- the claim loop (``run``): reaps expired leases, claims up to the free slots (per-task limits
  and serial schedules apart: ``claimer.py``), hands jobs to the pool; on SIGTERM it stops
  claiming and drains;
- pool threads run one job each (a handler, or a command child process they wait on);
- the recorder batches endings: successes in one fenced UPDATE over unnest arrays, failures in
  another; kept in memory while the database is away and written, with the instant each
  attempt ended, as soon as it answers again (a job stays held, its lease heartbeated, until
  its ending is recorded: ``queue_ending`` and ``recorded``);
- the supervisor (``supervisor.py``) extends the leases of held jobs (heartbeat), times out
  task handlers, and heartbeats the worker's row in ``instances``;
- the listener (``wakeups.py``) LISTENs for the schema's wake-ups and pokes the claim loop.

When a claim comes back short the loop sleeps until a wake-up, the earliest ``run_after`` of a
job not due yet, or the poll interval, whichever comes first (``claimer.py``).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import socket
import threading

from cronkeeper import clock, metrics
from cronkeeper.claiming import RECONNECT_CAP, ClaimingDatabase, ReconnectBackoff, SchemaFeature
from cronkeeper.db import instances as db_instances
from cronkeeper.db.attempts import attempts_output_column
from cronkeeper.db.engine import Connection, Engine
from cronkeeper.db.outbox_claims import OutboxJob
from cronkeeper.errors import DatabaseError
from cronkeeper.timing.zones import tzdata_version
from cronkeeper.worker import logcapture
from cronkeeper.worker.claimer import Claimer
from cronkeeper.worker.classify import Ending, Kind
from cronkeeper.worker.execute import account_commit, execute
from cronkeeper.worker.job_versions import JobVersions
from cronkeeper.worker.pool import ProcessPool
from cronkeeper.worker.recorder import record_loop
from cronkeeper.worker.runners import Runners
from cronkeeper.worker.runtime import Running, WorkerConfig
from cronkeeper.worker.supervisor import Supervisor
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
        self.lock = threading.Lock()
        self.endings: queue.SimpleQueue[tuple[Running, object]] = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.drain_deadline: float | None = None
        self.claimer = Claimer(config, self.db, running=self.running, lock=self.lock,
                               endings=self.endings, start=self._start, stopping=self.stopping)
        self.wakeups = Wakeups(engine, config.schema, config.poll_interval, self.claimer.notify,
                               self.stopping)
        self.recorder_done = threading.Event()
        self._runners = Runners(config.concurrency, self._execute)
        self.supervisor = Supervisor(self, self._runners.replace)
        self.pool = ProcessPool(config, engine, self.db.notes)  # --isolation process, @task(isolation=...)
        self.rand = random.Random()
        self.exit_code = 0
        self.stats = {"claimed": 0, "succeeded": 0, "failed": 0, "lost": 0}
        self.output_column = SchemaFeature(attempts_output_column)  # attempts.output (0010)?
        self.versions = JobVersions(config, self.db)  # output limits, commands' digests

    # -- control ---------------------------------------------------------------------------

    def stop(self, *, immediate: bool = False) -> None:
        """Stop claiming; running jobs get ``drain_timeout`` (none when ``immediate``)."""
        now = clock.monotonic()
        limit = now if immediate else now + self.config.drain_timeout
        if self.drain_deadline is None or limit < self.drain_deadline:
            self.drain_deadline = limit
        if not self.stopping.is_set():
            log.info("drain started: worker=%s running=%d", self.config.worker_id, len(self.running), extra={"action": "drain_started"})
        self.stopping.set()
        self.claimer.wake.set()

    # -- main loop -------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.config
        self._register_until_up()
        self.db.until_done("reading the schema", self.stopping, self._read_schema)
        logcapture.install_at_start(cfg)  # else the first job that keeps output installs it
        recorder = threading.Thread(target=record_loop, args=(self,), name="recorder", daemon=True)
        supervisor = threading.Thread(target=self.supervisor.loop, name="supervisor", daemon=True)
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
        while not self.stopping.is_set():
            try:
                if clock.monotonic() >= next_reap:
                    self.db.reap_expired(log, restart_grace=cfg.lease_margin)
                    next_reap = clock.monotonic() + cfg.reap_interval
                full = self.claimer.claim_round()
                backoff.reset()
            except DatabaseError:
                self.stopping.wait(backoff.next())
                continue
            self.claimer.await_room(full)
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

    def _register_until_up(self) -> None:
        cfg = self.config
        self.db.until_done("registering the worker", self.stopping,
                           lambda conn: db_instances.instances_register_holder(
                               conn, cluster=cfg.cluster, instance_id=cfg.worker_id,
                               host=socket.gethostname(), pid=os.getpid(), version=cfg.version,
                               schedules_digest=cfg.schedules_digest,
                               tzdata_version=tzdata_version()))

    # -- the jobs held, from claim until their ending is recorded ----------------------------

    def _start(self, jobs: list[OutboxJob]) -> None:
        if not jobs:
            return
        self.versions.learn(jobs)  # a statement only for versions not seen yet
        helds = [Running(job) for job in jobs]
        with self.lock:
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
        self.claimer.ahead.observe(clock.monotonic() - held.started)
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
        with self.lock:
            self.running.pop(held.job.id, None)
            held_now = len(self.running)
        self.claimer.let_go(held_now)

    def queue_ending(self, held: Running, ending: Ending) -> None:
        """Hand the ending to the recorder; the job's thread is free, its lease kept (the
        heartbeat extends it) until ``recorded``, so an ending kept while the database is away
        is not lost to the reaper, and the job not run again, when it answers again."""
        held.ended = clock.monotonic()
        held.output()  # what it printed until now (an abandoned handler may log on)
        with self.lock:
            self.running.pop(held.job.id, None)
            self.recording[(held.job.id, held.job.attempt)] = held
            held_now = len(self.running)
        self.endings.put((held, ending))
        self.claimer.let_go(held_now)

    def recorded(self, helds: list[Running]) -> None:
        with self.lock:
            for held in helds:
                self.recording.pop((held.job.id, held.job.attempt), None)

    # -- drain ------------------------------------------------------------------------------

    def _drain(self) -> None:
        deadline = self.drain_deadline or clock.monotonic()
        while self.running and clock.monotonic() < deadline:
            self.claimer.wake.wait(0.05)
            self.claimer.wake.clear()
        with self.lock:
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


def say_if_pid_one() -> None:
    """A worker that is PID 1 (a container's entrypoint without an init) inherits every orphan
    its commands leave, and Python reaps none: said at start, with the remedy."""
    if os.getpid() == 1:
        log.warning("worker runs as PID 1: orphans its commands and handler processes leave "
                    "behind become zombies that nothing reaps, until the container's PIDs "
                    "run out; run it under an init (docker run --init, tini, dumb-init)",
                    extra={"action": "pid_one"})
