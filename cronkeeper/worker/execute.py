"""Running one claimed job: a task through its handler, or a command from the worker's own
schedule files. Returns the attempt's ending, or None when the job was handed back."""

from __future__ import annotations

import logging

from cronkeeper import clock, metrics
from cronkeeper.db import outbox_endings
from cronkeeper.db.attempts import attempts_output_record
from cronkeeper.db.schedule_versions import versions_status
from cronkeeper.errors import DatabaseError
from cronkeeper.output import Capture
from cronkeeper.worker import commands, logcapture
from cronkeeper.worker.async_context import AsyncJobContext
from cronkeeper.worker.classify import Ending, Kind, exception_ending, exit_ending, start_ending
from cronkeeper.worker.context import JobContext
from cronkeeper.worker.invoke import Done, call_async
from cronkeeper.worker.logcapture import capturing
from cronkeeper.worker.pool import end_session
from cronkeeper.worker.registry import Handler, Isolation, resolve
from cronkeeper.worker.runtime import Host, Running

log = logging.getLogger("cronkeeper.worker")


def execute(worker: Host, held: Running) -> Ending | None:
    try:
        if held.job.task == "command":
            return run_command(worker, held)
        return run_task(worker, held)
    except Exception as exc:  # noqa: BLE001 - every failure is classified, none escapes
        return exception_ending(exc)


def run_task(worker: Host, held: Running) -> Ending | None:
    job = held.job
    handler = resolve(job.task)
    limit = worker.versions.output_limit(job)
    if held.done:  # released by the drain while reading its version: it must not start
        return None
    if limit > 0:
        logcapture.install()  # done at start unless this worker's limits are all 0
    if (handler.isolation or worker.config.isolation) == Isolation.PROCESS:
        # The worker reads what the handler process prints (its log records included) into
        # the capture; a job it committed itself has that written apart.
        held.capture = Capture(limit) if limit > 0 else None
        return settle_done(worker, held, worker.pool.run(held, end_session(worker.db)),
                           output_apart=True)
    # In this process its records are kept as lines (a capture is made only past the limit).
    if limit > 0:
        held.keep_records(limit)
    payload = handler.prepare(job.payload)
    if handler.is_async:
        return run_async(worker, held, handler.func, payload)
    ctx = JobContext(
        key=job.key, attempt=job.attempt, schedule=job.schedule, scheduled_for=job.scheduled_for,
        task=job.task, job_id=job.id, schema=worker.config.schema, engine=worker.engine,
        note=worker.db.notes.present,
    )
    held.ctx = ctx
    with capturing(held if limit > 0 else None):
        handler.func(payload, ctx)
    return Ending(Kind.SUCCEEDED)


def run_async(worker: Host, held: Running, func: Handler, payload: object) -> Ending | None:
    """An ``async def`` handler on this runner thread's loop, cancelled at the job's deadline."""
    job, cfg = held.job, worker.config
    ctx = AsyncJobContext(
        key=job.key, attempt=job.attempt, schedule=job.schedule, scheduled_for=job.scheduled_for,
        task=job.task, job_id=job.id, schema=cfg.schema, engine=worker.engine,
        note=worker.db.notes.present,
    )
    # The runner cancels it; the supervisor steps in only if the loop itself is blocked.
    held.timeout_grace = 2 * cfg.kill_grace + 5.0
    with capturing(held if held.output_limit > 0 else None):  # its tasks copy this context
        result = call_async(func, payload, ctx, cfg.worker_id, grace=cfg.kill_grace,
                            timeout=max(0.0, held.deadline - clock.monotonic()),
                            before_commit=held.settle, output=held.output,
                            keep_output=worker.output_column.present)
    if result.done is Done.FAILED:
        assert result.ending is not None
        if result.settled:
            worker.queue_ending(held, result.ending)
            return None
        return result.ending
    if result.done is Done.SUCCEEDED:
        return Ending(Kind.SUCCEEDED)
    if result.done is Done.DROPPED:
        return None
    return settle_done(worker, held, str(result.done), settled=True)


def settle_done(worker: Host, held: Running, done: Ending | str, settled: bool = False,
                output_apart: bool = False) -> Ending | None:
    """``done``: an Ending for the recorder, or the handler's own commit (committed, lost),
    for which only the bookkeeping is left (and, ``output_apart``, the attempt's output: a
    handler process committed without it)."""
    if isinstance(done, Ending):
        return done
    if not settled and not held.settle():
        return None  # timed out or released meanwhile: that ending is recorded (fenced)
    if output_apart:
        record_output(worker, held)
    account_commit(worker, held, committed=done == Done.COMMITTED)
    return None


def record_output(worker: Host, held: Running) -> None:
    """Write the attempt's output on its own (a handler process committed its job). In a
    transaction, not a statement: ``statement`` keeps a connection for the calling thread, and
    every runner thread keeping one emptied the worker's pool (the claim loop and the
    supervisor then waited 30 s for a connection, and the worker stopped)."""
    output = held.output()
    if output is None or not worker.output_column.present:
        return
    try:
        with worker.db.transaction("recording a job's output") as conn:
            attempts_output_record(conn, job_id=held.job.id, attempt=held.job.attempt,
                                   output=output)
    except DatabaseError:
        log.warning("output not recorded: job=%d key=%s attempt=%d: the database is away",
                    held.job.id, held.job.key, held.job.attempt,
                    extra={"action": "output_unrecorded"})


def account_commit(worker: Host, held: Running, *, committed: bool) -> None:
    """A job whose handler's transaction ended with its fenced completion (committed, or
    refused and rolled back: lease lost): the recorder never sees it, so count it here."""
    job = held.job
    if committed:
        worker.stats["succeeded"] += 1
    else:
        worker.stats["lost"] += 1
        log.warning("lease lost: job=%d key=%s attempt=%d: handler's transaction rolled back",
                    job.id, job.key, job.attempt, extra={"action": "lease_lost"})
    metrics.current().job_finished(
        job.schedule, job.owner, "succeeded" if committed else "lease_expired",
        clock.monotonic() - held.started if held.started else 0.0, job.attempt, final=committed)
    worker.forget(held)


def run_command(worker: Host, held: Running) -> Ending | None:
    job, cfg = held.job, worker.config
    spec = cfg.specs.get(job.schedule) if job.schedule is not None else None
    version = None
    if job.version_id is not None:
        known = worker.versions.digests.get(job.version_id)
        if spec is not None and known == spec.digest:
            # A version's digest never changes: one this worker ran is run again without a
            # round trip (whether it is still the newest matters only when the digests differ).
            version = (known, True)
        else:
            with worker.db.transaction("reading the job's schedule version") as conn:
                version = versions_status(conn, job.version_id)
            if version is not None:
                worker.versions.remember_digest(job.version_id, version[0])
    decision = commands.decide(job.schedule, job.version_id, version, spec)
    if decision.verdict is commands.Verdict.REFUSE:
        log.error("command refused: job=%d key=%s: %s", job.id, job.key, decision.reason, extra={"action": "command_refused"})
        return Ending(Kind.PERMANENT, decision.reason)
    if decision.verdict is commands.Verdict.WAIT:
        if not held.settle():
            return None
        try:
            with worker.db.transaction("handing a job back") as conn:
                outbox_endings.outbox_defer(conn, worker_id=cfg.worker_id, job_id=job.id, attempt=job.attempt,
                                delay=cfg.defer_delay, reason=decision.reason)
        except DatabaseError:
            pass  # the lease will expire and the job comes back
        log.warning("command waiting: job=%d key=%s: %s", job.id, job.key, decision.reason, extra={"action": "command_waiting"})
        worker.forget(held)
        return None
    assert decision.spec is not None and decision.spec.command is not None
    env = commands.job_env(job.schedule, job.scheduled_for, job.key, job.attempt,
                           job.payload_json)

    def on_start(proc):  # noqa: ANN001
        # Under the job's lock, as the drain settles it: either the drain sees this child
        # (and kills its group) or this sees the release (and kills it here).
        with held.lock:
            held.proc = proc
            released = held.done
        if released:
            commands.kill_group(proc, 0.0)

    if held.done:  # released by the drain while reading its version: it must not start
        return None
    limit = decision.spec.output_limit
    held.capture = Capture(limit) if limit > 0 else None
    try:
        result = commands.run(decision.spec.command, env, job.timeout, on_start=on_start,
                              kill_grace=cfg.kill_grace, capture=held.capture)
    except OSError as exc:
        return start_ending(decision.spec.command[0], exc)
    if result.code is None:
        return Ending(Kind.TIMEOUT, f"timed out after {job.timeout:g}s: process group killed")
    # The output's tail goes with the error (cronkeeper.output.with_tail, in the recorder).
    return exit_ending(result.code, decision.spec.permanent_exit_codes)
