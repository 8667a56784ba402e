"""Publishing one claimed batch: each job, in claim order, to the target of the first route that
matches it (docs/relay.md); the round's outcomes go to the recorder (``relay.recorder``).

- Targets that take a batch in one round trip (``publish_many``) get this round's jobs at once.
- A job is published only while the claim's lease is comfortably ahead: past a third of it the
  rest of the batch goes back uncounted. Each call to a target runs on that target's own thread
  and is waited for until half the lease (``relay.lanes``): a call still running then is the
  target's failure (its jobs go back uncounted, the target rests).
- A target that cannot be connected to rests (0.5 s doubling to 30 s); its jobs go back
  uncounted meanwhile. A refused publish is a failed attempt, judged by the worker's policy
  (``cronkeeper.endings``): permanent at once, else retried with backoff until the cap.
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta
from typing import cast

from cronkeeper import clock, metrics
from cronkeeper.claiming import ReconnectBackoff
from cronkeeper.db.outbox_claims import OutboxJob
from cronkeeper.db.outbox_endings import Failure
from cronkeeper.endings import Ending, Kind, next_state
from cronkeeper.relay.config import RelayConfig, Route
from cronkeeper.relay.lanes import Lanes
from cronkeeper.relay.recorder import RoundResult
from cronkeeper.relay.targets.base import (
    BatchPublisher,
    Delivery,
    PermanentPublishError,
    PublishError,
    RelayJob,
    Target,
    TargetUnavailable,
)

log = logging.getLogger("cronkeeper.relay")


class Publisher:
    def __init__(self, config: RelayConfig, targets: dict[str, Target]) -> None:
        self.config = config
        self.targets = targets
        self.skew = 0.0  # database clock minus this host's, at the relay's last heartbeat
        self._rest_until: dict[str, float] = {}
        self._rest = {name: ReconnectBackoff() for name in targets}
        self.rand = random.Random()
        self.published = 0
        self.lanes = Lanes(list(targets))

    def resting(self) -> list[str]:
        """The targets resting now (they could not be connected to)."""
        now = clock.monotonic()
        return [name for name, until in self._rest_until.items() if until > now]

    def publish(self, jobs: list[OutboxJob], claimed_at: float) -> RoundResult:
        out = RoundResult()
        m = metrics.current()
        # Publish only while the claim's lease is comfortably ahead: past a third of it (a slow
        # broker, a huge batch) the rest goes back uncounted rather than risk another relay
        # reclaiming, and republishing, jobs this one is still sending or marking. Jobs a target
        # already took in one batch (publish_many) are booked as published whatever the time.
        # Each call to a target is waited for until half the lease (relay.lanes): a broker that
        # answers a byte at a time cannot hold a publish past the lease, nor the relay with it.
        cutoff = claimed_at + self.config.lease / 3
        deadline = claimed_at + self.config.lease / 2
        ahead = self._publish_ahead(jobs, cutoff, deadline)
        cut = 0
        for job in jobs:
            done = ahead.get(job.id)
            if done is None and clock.monotonic() > cutoff:
                out.deferred.append((job, 0.0, "relay lease a third spent before publishing"))
                cut += 1
                continue
            route = self.config.route_for(job.task, job.schedule)
            if route is None:  # the regex and the glob disagree: a bug, never a lost job
                out.deferred.append((job, self.config.poll_interval, "no route matches (relay)"))
                continue
            target = self.targets[route.target]
            resting = self._rest_until.get(route.target, 0.0) - clock.monotonic()
            if resting > 0 and not isinstance(done, str):
                # (a job the target already took in this round's batch is booked below: it is
                # there, even if another job of the batch then found the target unreachable)
                out.deferred.append((job, resting, f"target {route.target} unreachable"))
                continue
            try:
                if isinstance(done, PublishError):
                    raise done
                target_id = done if done is not None else self.lanes.call(
                    route.target, deadline, target.publish, _relay_job(job, self.skew),
                    _delivery(route))
            except TargetUnavailable as exc:
                # Not this job's fault: hand it back uncounted and rest the target.
                m.relay_failed(route.target)
                delay = self._rest[route.target].next()
                self._rest_until[route.target] = clock.monotonic() + delay
                out.deferred.append((job, delay, f"publish: {exc}"))
                log.warning("target unreachable: target=%s rest=%.1fs error=%s", route.target,
                            delay, exc, extra={"action": "target_unreachable"})
                continue
            except PublishError as exc:
                m.relay_failed(route.target)
                out.failed.append(self._failure(job, exc))
                out.schedules[job.id] = job.schedule
                log.warning("publish failed: job=%d key=%s attempt=%d target=%s error=%s", job.id,
                            job.key, job.attempt, route.target, exc,
                            extra={"action": "publish_failed"})
                continue
            except Exception as exc:  # noqa: BLE001 - a target bug must not lose the batch
                m.relay_failed(route.target)
                out.failed.append(self._failure(job, PublishError(f"{type(exc).__name__}: {exc}")))
                out.schedules[job.id] = job.schedule
                log.warning("publish failed: job=%d key=%s attempt=%d target=%s error=%s: %s",
                            job.id, job.key, job.attempt, route.target, type(exc).__name__, exc,
                            extra={"action": "publish_failed"})
                continue
            self._rest[route.target].reset()
            self._rest_until.pop(route.target, None)
            out.published.append((job, route.target, target_id, clock.monotonic()))
            self.published += 1
        if cut:
            log.warning("batch cut short: jobs=%d handed back (lease %.0fs a third spent)", cut,
                        self.config.lease, extra={"action": "batch_cut_short"})
        return out

    def _publish_ahead(self, jobs: list[OutboxJob], cutoff: float,
                       deadline: float) -> dict[int, str | PublishError]:
        """For targets that publish a batch in one round trip (``publish_many``), publish this
        round's jobs of each such target at once; the per-job loop then books each outcome as if
        it had published the job itself. A failure of the whole call is the first job's outcome
        when the target is unreachable (the loop rests the target and hands the others back
        uncounted), every job's otherwise."""
        if clock.monotonic() > cutoff:
            return {}  # the whole batch goes back (below)
        batches: dict[str, list[tuple[OutboxJob, Route]]] = {}
        for job in jobs:
            route = self.config.route_for(job.task, job.schedule)
            if route is None or not hasattr(self.targets[route.target], "publish_many"):
                continue
            if self._rest_until.get(route.target, 0.0) > clock.monotonic():
                continue
            batches.setdefault(route.target, []).append((job, route))
        ahead: dict[int, str | PublishError] = {}
        for name, batch in batches.items():
            try:
                found = self.lanes.call(
                    name, deadline, cast(BatchPublisher, self.targets[name]).publish_many,
                    [(_relay_job(job, self.skew), _delivery(route)) for job, route in batch])
            except TargetUnavailable as exc:
                ahead[batch[0][0].id] = exc
                continue
            except PublishError as exc:
                found = [exc] * len(batch)
            except Exception as exc:  # noqa: BLE001 - a target bug must not lose the batch
                found = [PublishError(f"{type(exc).__name__}: {exc}")] * len(batch)
            ahead.update((job.id, result) for (job, _), result in zip(batch, found, strict=True))
        return ahead

    def _failure(self, job: OutboxJob, exc: PublishError) -> Failure:
        """A failed publish is a failed attempt, judged by the worker's policy
        (``cronkeeper.endings``): permanent at once, else retried until the cap."""
        kind = Kind.PERMANENT if isinstance(exc, PermanentPublishError) else Kind.RETRYABLE
        nxt = next_state(Ending(kind, f"publish: {exc}"), job.attempt, job.max_attempts,
                         job.backoff, self.rand.random())
        return Failure(job.id, job.attempt, nxt.state, nxt.delay, nxt.error, nxt.outcome)


def _relay_job(job: OutboxJob, skew: float) -> RelayJob:
    """The target's view of a claimed job; whether it is still to wait is reckoned on the
    database's clock (this host's plus ``skew``), never on this host's alone."""
    db_now = clock.wall() + timedelta(seconds=skew)
    return RelayJob(
        id=job.id, key=job.key, schedule=job.schedule, scheduled_for=job.scheduled_for,
        task=job.task, payload=job.payload, attempt=job.attempt, max_attempts=job.max_attempts,
        timeout=job.timeout, run_after=job.run_after, created_at=job.created_at,  # type: ignore[arg-type]
        due_in=(job.run_after - db_now).total_seconds(),  # type: ignore[operator]
    )


def _delivery(route: Route) -> Delivery:
    return Delivery(queue=route.queue, options=route.options)
