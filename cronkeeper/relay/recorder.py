"""The relay's recorder thread: writes each round's outcomes (published, failed, handed back)
while the next round is claimed and published. Marks are fenced (db/outbox_endings.py), so a relay whose
lease ran out cannot mark a job another relay took; writes that keep failing are given up after
half the lease, and the jobs are then claimed again (republished with the same ids: at least
once)."""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field

from cronkeeper import clock, metrics
from cronkeeper.claiming import ClaimingDatabase, ReconnectBackoff
from cronkeeper.db import outbox_endings
from cronkeeper.db.outbox_claims import OutboxJob
from cronkeeper.errors import DatabaseError

log = logging.getLogger("cronkeeper.relay")


@dataclass
class RoundResult:
    """One round's results."""

    published: list[tuple[OutboxJob, str, str, float]] = field(default_factory=list)
    # ^ job, target, target id, acknowledged at (monotonic)
    failed: list[outbox_endings.Failure] = field(default_factory=list)
    deferred: list[tuple[OutboxJob, float, str]] = field(default_factory=list)
    # ^ job, delay, reason: handed back without counting the attempt
    schedules: dict[int, str | None] = field(default_factory=dict)  # of the failed, by job id


class Recorder:
    def __init__(self, database: ClaimingDatabase, *, relay_id: str, lease: float,
                 stopping: threading.Event, stats: dict[str, int]) -> None:
        self.db = database
        self.relay_id = relay_id
        self.lease = lease
        self.stopping = stopping
        self.stats = stats
        # At most one round waits (publishing stops a third into a lease), so no lease runs out
        # in the queue.
        self.outcomes: queue.Queue[RoundResult | None] = queue.Queue(maxsize=1)

    def put(self, outcome: RoundResult) -> None:
        self.outcomes.put(outcome)

    def finish(self) -> None:
        self.outcomes.put(None)

    def run(self) -> None:
        while True:
            out = self.outcomes.get()
            if out is None:
                break
            try:
                self._record(out)
            except Exception as exc:  # noqa: BLE001 - the jobs are reclaimed when leases expire
                log.error("recording outcomes failed: error=%s", exc,
                          extra={"action": "outcomes_not_recorded"})
        self.db.close_kept()

    def _record(self, out: RoundResult) -> None:
        deadline = clock.monotonic() + self.lease / 2
        backoff = ReconnectBackoff(first=0.2, cap=5.0)
        while True:
            try:
                self._write(out)
                return
            except DatabaseError:
                if clock.monotonic() + backoff.current > deadline or self.stopping.is_set():
                    log.error("outcomes not recorded: published=%d failed=%d: the jobs will be "
                              "claimed again when their leases expire", len(out.published),
                              len(out.failed), extra={"action": "outcomes_not_recorded"})
                    return
                self.stopping.wait(backoff.next())

    def _write(self, out: RoundResult) -> None:
        """Each kind in one statement; what was written is dropped from ``out``, so a retry
        after a failure writes only the rest."""
        m = metrics.current()
        if out.published:
            jobs = [p[0] for p in out.published]
            with self.db.statement("marking jobs published") as conn:
                marked_at = clock.monotonic()
                due = outbox_endings.outbox_mark_published(
                    conn, relay_id=self.relay_id, ids=[j.id for j in jobs],
                    attempts=[j.attempt for j in jobs], targets=[p[1] for p in out.published],
                    target_ids=[p[2] for p in out.published],
                )
            for job, target, _tid, acked in out.published:
                if job.id in due:
                    m.relay_published_one(target, due[job.id] - (marked_at - acked))
                    m.relay_settled(job.schedule, job.attempt)
                else:
                    log.warning("lease lost before the mark: job=%d key=%s attempt=%d", job.id,
                                job.key, job.attempt, extra={"action": "lease_lost"})
            self.stats["published"] += len(due)
            out.published = []
        if out.failed:
            note = self.db.has(self.db.notes)
            with self.db.statement("recording failed publishes") as conn:
                done = set(outbox_endings.outbox_fail(
                    conn, worker_id=self.relay_id, failures=out.failed, note=note))
            for f in out.failed:
                if f.state == "dead" and f.id in done:
                    m.relay_settled(out.schedules.get(f.id), f.attempt)
            self.stats["failed"] += len(out.failed)
            out.failed = []
        while out.deferred:
            job, delay, reason = out.deferred[0]
            with self.db.statement("handing jobs back") as conn:
                outbox_endings.outbox_defer(conn, worker_id=self.relay_id, job_id=job.id,
                                            attempt=job.attempt, delay=delay, reason=reason)
            self.stats["deferred"] += 1
            out.deferred.pop(0)
