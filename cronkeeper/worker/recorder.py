"""The recorder thread: job endings, batched (it waits up to ``LINGER`` for more while jobs are
held). Successes are one fenced UPDATE over unnest arrays, failures another, on a connection the
thread keeps (autocommit: each statement is atomic and fenced on its own).

While the database is away, endings are kept in memory (each with the instant its attempt
ended, recorded as the attempt's end) and their jobs stay held, their leases heartbeated; the
recorder tries again every ``RETRY_CAP`` seconds at most, and at once when another thread's
statement succeeds. A lost lease (the fence refused the ending: another worker took the job)
is counted and logged."""

from __future__ import annotations

import logging
import queue

from cronkeeper import clock, metrics
from cronkeeper.claiming import ReconnectBackoff
from cronkeeper.db.outbox_endings import Failure, outbox_complete, outbox_fail
from cronkeeper.errors import DatabaseError
from cronkeeper.output import with_tail
from cronkeeper.worker.classify import Ending, Kind, next_state
from cronkeeper.worker.runtime import Host, Running

log = logging.getLogger("cronkeeper.worker")

MAX_BATCH = 1000
LINGER = 0.005  # seconds the recorder waits for more endings while jobs are still held
RETRY_CAP = 1.0  # most seconds between two tries to write kept endings while the database is away


def record_loop(worker: Host) -> None:
    endings = worker.endings
    backoff = ReconnectBackoff(cap=RETRY_CAP)
    pending: list[tuple[Running, Ending]] = []
    closing = False
    while True:
        try:
            item = endings.get(timeout=0.5)
            linger_until = clock.monotonic() + LINGER
            while True:
                if item[0] is None:
                    closing = True
                else:
                    pending.append(item)  # type: ignore[arg-type]
                if len(pending) >= MAX_BATCH:
                    break
                try:
                    item = endings.get_nowait()
                except queue.Empty:
                    # More endings are coming while jobs are held: wait a moment for them, so a
                    # stream of fast jobs is recorded in batches, not one statement per job.
                    wait = linger_until - clock.monotonic()
                    if closing or wait <= 0 or not worker.running:
                        raise
                    item = endings.get(timeout=wait)
        except queue.Empty:
            pass
        if pending:
            try:
                record(worker, pending)
                pending = []
                backoff.reset()
            except DatabaseError:
                deadline = worker.drain_deadline
                if closing and deadline is not None and clock.monotonic() > deadline + 10:
                    log.error("endings unrecorded: jobs=%d: leases will expire", len(pending), extra={"action": "endings_unrecorded"})
                    break
                worker.db.wait_answer(backoff.next())
                continue
        if closing and endings.empty():
            break
    worker.db.close_kept()
    worker.recorder_done.set()


def record(worker: Host, pending: list[tuple[Running, Ending]]) -> None:
    """Record the endings; successes leave ``pending`` once committed (so a retry after the
    failures' statement failed does not count them as lost)."""
    cfg = worker.config
    pending_before = list(pending)
    now = clock.monotonic()
    ok: list[Running] = []
    ok_ages: list[float] = []  # seconds since each attempt ended (kept while the database was away)
    failed_helds: list[Running] = []
    failures: list[Failure] = []
    keep = worker.db.has(worker.output_column)
    note = worker.db.has(worker.db.notes)
    for held, ending in pending:
        job = held.job
        age = max(0.0, now - held.ended) if held.ended else 0.0
        if ending.kind is Kind.SUCCEEDED:
            ok.append(held)
            ok_ages.append(age)
            continue
        failed_helds.append(held)
        if held.released:
            failures.append(_failure(held, "available", 0.0, ending.error, "released", age, keep))
            continue
        nxt = next_state(ending, job.attempt, job.max_attempts, job.backoff, worker.rand.random())
        failures.append(_failure(held, nxt.state, nxt.delay, nxt.error, nxt.outcome, age, keep))
    lost = 0
    if ok:
        with worker.db.statement("recording job endings") as conn:
            done = outbox_complete(
                conn, worker_id=cfg.worker_id, ids=[h.job.id for h in ok],
                attempts=[h.job.attempt for h in ok], ages=ok_ages,
                outputs=[h.output() for h in ok] if keep else None, note=note)
        worker.stats["succeeded"] += len(done)
        lost += len(ok) - len(done)
        # Committed: a retry after a failure below must not present these again.
        pending[:] = [item for item in pending if item[1].kind is not Kind.SUCCEEDED]
        worker.recorded(ok)
    if failures:
        with worker.db.statement("recording job endings") as conn:
            failed = outbox_fail(conn, worker_id=cfg.worker_id, failures=failures,
                                 keep_output=keep, note=note)
        worker.stats["failed"] += len(failed)
        lost += len(failures) - len(failed)
        worker.recorded(failed_helds)
    if lost:
        worker.stats["lost"] += lost
        log.warning("lease lost: jobs=%d: their endings were not recorded (another "
                    "worker took them after the lease expired)", lost, extra={"action": "lease_lost"})
    _observe(pending_before, failures)
    for f in failures:
        log.info("job failed: job=%d attempt=%d next=%s outcome=%s error=%s",
                 f.id, f.attempt, f.state, f.outcome, f.error[:200], extra={"action": "job_failed"})


def _failure(held: Running, state: str, delay: float, error: str, outcome: str, age: float,
             keep: bool) -> Failure:
    """A failed attempt: with its output when the schema keeps it, the job's last_error then
    carrying the output's tail; else the tail goes with the attempt's error too."""
    job, output = held.job, held.output()
    if keep:
        return Failure(job.id, job.attempt, state, delay, error, outcome, age, output,
                       with_tail(error, output))
    return Failure(job.id, job.attempt, state, delay, with_tail(error, output), outcome, age)


def _observe(pending: list[tuple[Running, Ending]], failures: list[Failure]) -> None:
    """Metrics for each recorded ending, and one error line per dead letter (§8: who is alerted)."""
    sink = metrics.current()
    outcome_of = {f.id: f for f in failures}
    now = clock.monotonic()
    for held, ending in pending:
        job = held.job
        failure = outcome_of.get(job.id)
        outcome = "succeeded" if ending.kind is Kind.SUCCEEDED else (failure.outcome if failure else "retry")
        sink.job_finished(job.schedule, job.owner, outcome, now - held.started if held.started else 0.0,
                          job.attempt)
        if failure is not None and failure.state == "dead":
            log.error(
                "dead letter: job %d (%s) after %d attempt(s): %s", job.id, job.key, job.attempt,
                (failure.error or "")[:200],
                extra={"action": "dead_letter", "schedule": job.schedule, "owner": job.owner,
                       "job_id": job.id},
            )
