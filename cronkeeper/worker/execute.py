"""Running one claimed job: a task through its handler, or a command from the worker's own
schedule files. Returns the attempt's ending, or None when the job was handed back."""

from __future__ import annotations

import logging

from cronkeeper import clock, metrics
from cronkeeper.db import outbox_endings as db
from cronkeeper.db.schedule_versions import versions_status
from cronkeeper.errors import DatabaseError
from cronkeeper.worker import commands
from cronkeeper.worker.async_context import AsyncJobContext
from cronkeeper.worker.classify import Ending, Kind, exception_ending, exit_ending
from cronkeeper.worker.context import JobContext
from cronkeeper.worker.invoke import Done, call_async
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
    if (handler.isolation or worker.config.isolation) == Isolation.PROCESS:
        return settle_done(worker, held, worker.pool.run(held, end_session(worker.db)))
    payload = handler.prepare(job.payload)
    if handler.is_async:
        return run_async(worker, held, handler.func, payload)
    ctx = JobContext(
        key=job.key, attempt=job.attempt, schedule=job.schedule, scheduled_for=job.scheduled_for,
        task=job.task, job_id=job.id, schema=worker.config.schema, engine=worker.engine,
    )
    held.ctx = ctx
    handler.func(payload, ctx)
    return Ending(Kind.SUCCEEDED)


def run_async(worker: Host, held: Running, func: Handler, payload: object) -> Ending | None:
    """An ``async def`` handler on this runner thread's loop, cancelled at the job's deadline."""
    job, cfg = held.job, worker.config
    ctx = AsyncJobContext(
        key=job.key, attempt=job.attempt, schedule=job.schedule, scheduled_for=job.scheduled_for,
        task=job.task, job_id=job.id, schema=cfg.schema, engine=worker.engine,
    )
    # The runner cancels it; the supervisor steps in only if the loop itself is blocked.
    held.timeout_grace = 2 * cfg.kill_grace + 5.0
    result = call_async(func, payload, ctx, cfg.worker_id, grace=cfg.kill_grace,
                        timeout=max(0.0, held.deadline - clock.monotonic()),
                        before_commit=held.settle)
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


def settle_done(worker: Host, held: Running, done: Ending | str, settled: bool = False) -> Ending | None:
    """``done``: an Ending for the recorder, or the handler's own commit (committed, lost),
    for which only the bookkeeping is left."""
    if isinstance(done, Ending):
        return done
    if not settled and not held.settle():
        return None  # timed out or released meanwhile: that ending is recorded (fenced)
    account_commit(worker, held, committed=done == Done.COMMITTED)
    return None


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
    version = None
    if job.version_id is not None:
        with worker.db.transaction("reading the job's schedule version") as conn:
            version = versions_status(conn, job.version_id)
    spec = cfg.specs.get(job.schedule) if job.schedule is not None else None
    decision = commands.decide(job.schedule, job.version_id, version, spec)
    if decision.verdict is commands.Verdict.REFUSE:
        log.error("command refused: job=%d key=%s: %s", job.id, job.key, decision.reason, extra={"action": "command_refused"})
        return Ending(Kind.PERMANENT, decision.reason)
    if decision.verdict is commands.Verdict.WAIT:
        if not held.settle():
            return None
        try:
            with worker.db.transaction("handing a job back") as conn:
                db.outbox_defer(conn, worker_id=cfg.worker_id, job_id=job.id, attempt=job.attempt,
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
        held.proc = proc

    try:
        result = commands.run(decision.spec.command, env, job.timeout, on_start=on_start,
                              kill_grace=cfg.kill_grace)
    except OSError as exc:
        return Ending(Kind.PERMANENT, f"cannot start {decision.spec.command[0]!r}: {exc}")
    if result.code is None:
        return Ending(Kind.TIMEOUT, f"timed out after {job.timeout:g}s: process group killed"
                      + (f": {result.stderr_tail.strip()[-500:]}" if result.stderr_tail.strip() else ""))
    return exit_ending(result.code, decision.spec.permanent_exit_codes, result.stderr_tail[-500:])
