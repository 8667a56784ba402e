"""The relay: claim routed jobs under a short lease, publish each to its target, then mark them
``published`` (docs/relay.md).

Three threads: the publish loop, in rounds; a claimer that claims the next batch while one is
published (when the last claim came back full); and a recorder that writes each round's
outcomes meanwhile (at most one round waits for it). The rounds:
- register this relay's routes in ``relay_routes`` (workers' claims skip what they match);
- reap expired leases (the statement workers use);
- claim up to ``batch_size`` routed jobs with the workers' claim (``outbox_claim`` with the
  relay's routes and a lease of ``lease`` seconds, not the job's timeout), plus serial jobs one
  schedule at a time (``outbox_claim_serial``: not while the previous one runs or is published
  and neither reported finished nor past its timeout);
- publish each, in claim order, to the target of the first route that matches it; then, in one
  statement per outcome, mark the published (fenced), fail the refused (backoff with full
  jitter, dead letter after the job's attempts, at once when permanent; a connection lost in
  the middle of a publish counts too: the message may be what breaks it), and hand back
  uncounted the jobs of a target that cannot be connected to (it then rests, 0.5 s doubling to
  30 s);
- every ``status_interval``, ask targets that can tell about published jobs still inside their
  timeout, and record ``succeeded`` / ``dead`` with ``finished_at``.

At least once: the mark comes after the broker acknowledged. A relay that dies between the two
leaves the job ``running`` until its lease expires; it is then claimed again and republished with
the same target id (docs/relay.md says what consumers do about it).
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import cast

from cronkeeper import __version__, clock, metrics
from cronkeeper.claiming import RECONNECT_CAP, ClaimingDatabase, ReconnectBackoff
from cronkeeper.db import instances as db_instances
from cronkeeper.db import outbox, relay_routes
from cronkeeper.db import outbox_claims as db
from cronkeeper.db.engine import Engine, serial_lock_key
from cronkeeper.db.outbox_endings import Failure
from cronkeeper.endings import Ending, Kind, next_state
from cronkeeper.errors import DatabaseError
from cronkeeper.relay.config import RelayConfig, Route
from cronkeeper.relay.recorder import Recorder, RoundResult
from cronkeeper.relay.targets.base import (
    BatchPublisher,
    Completion,
    Delivery,
    PermanentPublishError,
    PublishError,
    RelayJob,
    Target,
    TargetUnavailable,
)
from cronkeeper.timing import tzdata_version

log = logging.getLogger("cronkeeper.relay")

_STATUS_BATCH = 500  # most published jobs asked about per status round


class Relay:
    def __init__(self, engine: Engine, config: RelayConfig, targets: dict[str, Target], *,
                 relay_id: str, schema: str = "cronkeeper", cluster: str = "default") -> None:
        self.config = config
        self.targets = targets
        self.relay_id = relay_id
        self.schema = schema
        self.cluster = cluster
        self.db = ClaimingDatabase(engine)
        self.routes = db.Routes(
            tasks=tuple(r.task_regex for r in config.routes),
            schedules=tuple(r.schedule_regex for r in config.routes),
        )
        self._stopping = threading.Event()
        self._skew = 0.0  # database clock minus this host's, at the last heartbeat
        self._rest_until: dict[str, float] = {}
        self._rest = {name: ReconnectBackoff() for name in targets}
        self.rand = random.Random()
        self.published = 0
        self.stats = {"claimed": 0, "published": 0, "failed": 0, "deferred": 0, "finished": 0,
                      "rounds": 0}
        self.registered = threading.Event()
        # Outcomes are written by a recorder thread while the next batch is claimed and
        # published; at most one batch waits, so no lease runs out in the queue.
        self.recorder = Recorder(self.db, relay_id=relay_id, lease=config.lease,
                                 stopping=self._stopping, stats=self.stats)
        self._claimer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-claimer")
        self._ahead: Future[tuple[list[db.OutboxJob], float]] | None = None

    def stop(self) -> None:
        self._stopping.set()

    # -- main loop -------------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.config
        self._register_until_up()
        log.info("relay started: relay=%s config=%s targets=%s", self.relay_id, cfg.name,
                 ",".join(self.targets), extra={"action": "relay_started"})
        recorder = threading.Thread(target=self.recorder.run, name="relay-recorder", daemon=True)
        recorder.start()
        backoff = ReconnectBackoff(cap=RECONNECT_CAP)
        next_reap = next_status = next_serial = 0.0
        while not self._stopping.is_set():
            try:
                now = clock.monotonic()
                if now >= next_reap:
                    self.db.reap_expired(log)
                    next_reap = now + max(0.2, min(5.0, cfg.lease / 4))
                    with self.db.statement("heartbeating the relay") as conn:
                        skew = db_instances.instances_heartbeat_holder(
                            conn, cluster=self.cluster, instance_id=self.relay_id,
                            local_now=clock.wall())
                    if skew is not None:
                        self._skew = skew
                        metrics.current().set_skew(skew)
                claimed = self._round()
                if now >= next_serial:
                    next_serial = now + min(cfg.poll_interval, 1.0)
                    claimed += self._serial_round()
                if now >= next_status:
                    next_status = now + cfg.status_interval
                    self._poll_completions()
                backoff.reset()
                self.stats["rounds"] += 1
            except DatabaseError:
                self._stopping.wait(backoff.next())
                continue
            if claimed < cfg.batch_size:
                self._stopping.wait(cfg.poll_interval)
        self._hand_back_ahead()
        self._claimer.shutdown(wait=True)
        self.recorder.finish()
        recorder.join(cfg.lease)
        for target in self.targets.values():
            try:
                target.close()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the stop
                log.warning("target close failed: target=%s error=%s", target.name, exc,
                            extra={"action": "target_close_failed"})
        self.db.close_kept()
        log.info("relay stopped: relay=%s stats=%s", self.relay_id, self.stats,
                 extra={"action": "relay_stopped"})
        return 0

    def _register_until_up(self) -> None:
        rows = [
            relay_routes.RouteRow(r.position, r.target, list(r.tasks) if r.tasks else None,
                              list(r.schedules) if r.schedules else None, r.task_regex,
                              r.schedule_regex)
            for r in self.config.routes
        ]

        def register(conn) -> None:
            relay_routes.relay_routes_register(conn, relay=self.config.name, routes=rows)
            db_instances.instances_register_holder(
                conn, cluster=self.cluster, instance_id=self.relay_id,
                host=socket.gethostname(), pid=os.getpid(), version=__version__,
                schedules_digest=self.config.digest, tzdata_version=tzdata_version(),
                kind="relay",
            )

        if self.db.until_done("registering the relay's routes", self._stopping, register):
            self.registered.set()

    def _resting(self) -> list[str]:
        now = clock.monotonic()
        return [name for name, until in self._rest_until.items() if until > now]

    def _claim(self) -> tuple[list[db.OutboxJob], float]:
        """One claim (on the calling thread's kept connection) and when it was made."""
        cfg = self.config
        claimed_at = clock.monotonic()
        with self.db.statement("claiming jobs") as conn:
            jobs = db.outbox_claim(
                conn, worker_id=self.relay_id, limit=cfg.batch_size, lease_margin=0.0,
                exclude_tasks=["command"], routes=self.routes, lease=cfg.lease,
            )
        return jobs, claimed_at

    def _round(self) -> int:
        """Publish one batch. A full batch means more is probably waiting: the next claim then
        runs on the claimer thread while this batch is published (one batch ahead at most, its
        lease counted from its own claim)."""
        if self.routes.tasks == () or len(self._resting()) == len(self.targets):
            return self._hand_back_ahead()
        if self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            jobs, claimed_at = self._renewed(*ahead.result())
        else:
            jobs, claimed_at = self._claim()
        if len(jobs) == self.config.batch_size and not self._stopping.is_set():
            self._ahead = self._claimer.submit(self._claim)
        if jobs:
            self._publish_and_record(jobs, claimed_at)
        return len(jobs)

    def _renewed(self, jobs: list[db.OutboxJob], claimed_at: float
                 ) -> tuple[list[db.OutboxJob], float]:
        """A batch claimed ahead waited while the previous one was published: renew its leases
        (the workers' heartbeat statement) so its publishing budget starts now. A job whose
        lease was lost meanwhile is left to whoever took it."""
        if not jobs or clock.monotonic() - claimed_at < 1.0:
            return jobs, claimed_at
        renewed_at = clock.monotonic()
        with self.db.statement("renewing leases") as conn:
            kept = set(db.outbox_lease_extend(conn, worker_id=self.relay_id, ids=[j.id for j in jobs],
                                       attempts=[j.attempt for j in jobs],
                                       margin=self.config.lease))
        return [j for j in jobs if j.id in kept], renewed_at

    def _hand_back_ahead(self) -> int:
        """Jobs claimed ahead that will not be published now go back uncounted."""
        if self._ahead is None:
            return 0
        ahead, self._ahead = self._ahead, None
        try:
            jobs, _ = ahead.result()
        except DatabaseError:
            return 0
        if jobs:
            self.stats["claimed"] += len(jobs)
            self.recorder.put(RoundResult(deferred=[(j, 0.0, "relay stopping") for j in jobs]))
        return 0

    def _serial_round(self) -> int:
        if not self.config.routes:
            return 0
        with self.db.transaction("finding serial jobs") as conn:
            names = db.outbox_serial_candidates(conn, limit=self.config.batch_size,
                                                exclude_tasks=["command"], routes=self.routes)
        claimed = 0
        for name in names:
            key = serial_lock_key(self.schema, name)
            with self.db.transaction("claiming a serial job") as conn:
                job = db.outbox_claim_serial(conn, schedule=name, lock_key=key,
                                             worker_id=self.relay_id, lease_margin=0.0,
                                             lease=self.config.lease)
            if job is not None:
                claimed += 1
                self._publish_and_record([job], clock.monotonic())
        return claimed

    # -- publish ---------------------------------------------------------------------------

    def _publish_and_record(self, jobs: list[db.OutboxJob], claimed_at: float) -> None:
        self.stats["claimed"] += len(jobs)
        self.recorder.put(self._publish(jobs, claimed_at))

    def _publish_ahead(self, jobs: list[db.OutboxJob],
                       cutoff: float) -> dict[int, str | PublishError]:
        """For targets that publish a batch in one round trip (``publish_many``), publish this
        round's jobs of each such target at once; the per-job loop then books each outcome as if
        it had published the job itself. A failure of the whole call is the first job's outcome
        when the target is unreachable (the loop rests the target and hands the others back
        uncounted), every job's otherwise."""
        if clock.monotonic() > cutoff:
            return {}  # the whole batch goes back (below)
        batches: dict[str, list[tuple[db.OutboxJob, Route]]] = {}
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
                found = cast(BatchPublisher, self.targets[name]).publish_many(
                    [(_relay_job(job, self._skew), _delivery(route)) for job, route in batch])
            except TargetUnavailable as exc:
                ahead[batch[0][0].id] = exc
                continue
            except PublishError as exc:
                found = [exc] * len(batch)
            except Exception as exc:  # noqa: BLE001 - a target bug must not lose the batch
                found = [PublishError(f"{type(exc).__name__}: {exc}")] * len(batch)
            ahead.update((job.id, result) for (job, _), result in zip(batch, found, strict=True))
        return ahead

    def _publish(self, jobs: list[db.OutboxJob], claimed_at: float) -> RoundResult:
        out = RoundResult()
        m = metrics.current()
        # Publish only while the claim's lease is comfortably ahead: past a third of it (a slow
        # broker, a huge batch) the rest goes back uncounted rather than risk another relay
        # reclaiming, and republishing, jobs this one is still sending or marking. Jobs a target
        # already took in one batch (publish_many) are booked as published whatever the time.
        cutoff = claimed_at + self.config.lease / 3
        ahead = self._publish_ahead(jobs, cutoff)
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
                target_id = done if done is not None else target.publish(_relay_job(job, self._skew),
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
                continue
            self._rest[route.target].reset()
            self._rest_until.pop(route.target, None)
            out.published.append((job, route.target, target_id, clock.monotonic()))
            self.published += 1
        if cut:
            log.warning("batch cut short: jobs=%d handed back (lease %.0fs a third spent)", cut,
                        self.config.lease, extra={"action": "batch_cut_short"})
        return out

    def _failure(self, job: db.OutboxJob, exc: PublishError) -> Failure:
        """A failed publish is a failed attempt, judged by the worker's policy
        (``cronkeeper.endings``): permanent at once, else retried until the cap."""
        kind = Kind.PERMANENT if isinstance(exc, PermanentPublishError) else Kind.RETRYABLE
        nxt = next_state(Ending(kind, f"publish: {exc}"), job.attempt, job.max_attempts,
                         job.backoff, self.rand.random())
        return Failure(job.id, job.attempt, nxt.state, nxt.delay, nxt.error, nxt.outcome)

    def _poll_completions(self) -> None:
        asking = [name for name, t in self.targets.items()
                  if getattr(t, "reports_completion", True)]
        if not asking:
            return
        with self.db.statement("reading published jobs") as conn:
            open_jobs = outbox.outbox_published_open(conn, targets=asking,
                                                       limit=_STATUS_BATCH)
        by_target: dict[str, list[outbox.Published]] = {}
        for job in open_jobs:
            by_target.setdefault(job.target, []).append(job)
        ids, states = [], []
        for name, jobs in by_target.items():
            target = self.targets[name]
            many = getattr(target, "status_many", None)  # one round trip for the lot
            found = (many([j.target_id for j in jobs]) if many is not None
                     else [target.status(j.target_id) for j in jobs])
            for job, state in zip(jobs, found, strict=True):
                if state is Completion.SUCCEEDED:
                    ids.append(job.id)
                    states.append("succeeded")
                elif state is Completion.FAILED:
                    ids.append(job.id)
                    states.append("dead")
        if ids:
            note = self.db.has(self.db.notes)
            with self.db.statement("recording completions") as conn:
                n = outbox.outbox_published_finish(conn, ids=ids, states=states, note=note)
            self.stats["finished"] += n


def _relay_job(job: db.OutboxJob, skew: float) -> RelayJob:
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
