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
- publish each, in claim order, to the target of the first route that matches it
  (``relay.publisher``); then, in one statement per outcome (``relay.recorder``), mark the
  published (fenced), fail the refused (backoff with full jitter, dead letter after the job's
  attempts, at once when permanent; a connection lost in the middle of a publish counts too:
  the message may be what breaks it), and hand back uncounted the jobs of a target that cannot
  be connected to (it then rests, 0.5 s doubling to 30 s);
- every ``status_interval``, ask targets that can tell about published jobs still inside their
  timeout, and record ``succeeded`` / ``dead`` with ``finished_at`` (``relay.completions``).

At least once: the mark comes after the broker acknowledged. A relay that dies between the two
leaves the job ``running`` until its lease expires; it is then claimed again and republished with
the same target id (docs/relay.md says what consumers do about it).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from cronkeeper import __version__, clock, metrics
from cronkeeper.claiming import RECONNECT_CAP, ClaimingDatabase, ReconnectBackoff
from cronkeeper.db import instances as db_instances
from cronkeeper.db import outbox_claims, relay_routes
from cronkeeper.db.engine import Engine, serial_lock_key
from cronkeeper.db.outbox_claims import OutboxJob
from cronkeeper.errors import DatabaseError
from cronkeeper.relay.completions import poll_completions
from cronkeeper.relay.config import RelayConfig
from cronkeeper.relay.publisher import Publisher
from cronkeeper.relay.recorder import Recorder, RoundResult
from cronkeeper.relay.targets.base import Target
from cronkeeper.timing import tzdata_version

log = logging.getLogger("cronkeeper.relay")


class Relay:
    def __init__(self, engine: Engine, config: RelayConfig, targets: dict[str, Target], *,
                 relay_id: str, schema: str = "cronkeeper", cluster: str = "default") -> None:
        self.config = config
        self.targets = targets
        self.relay_id = relay_id
        self.schema = schema
        self.cluster = cluster
        self.db = ClaimingDatabase(engine)
        self.routes = outbox_claims.Routes(
            tasks=tuple(r.task_regex for r in config.routes),
            schedules=tuple(r.schedule_regex for r in config.routes),
        )
        self._stopping = threading.Event()
        self.publisher = Publisher(config, targets)
        self.stats = {"claimed": 0, "published": 0, "failed": 0, "deferred": 0, "finished": 0,
                      "rounds": 0}
        self.registered = threading.Event()
        # Outcomes are written by a recorder thread while the next batch is claimed and
        # published; at most one batch waits, so no lease runs out in the queue.
        self.recorder = Recorder(self.db, relay_id=relay_id, lease=config.lease,
                                 stopping=self._stopping, stats=self.stats)
        self._claimer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-claimer")
        self._ahead: Future[tuple[list[OutboxJob], float]] | None = None

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
                        self.publisher.skew = skew
                        metrics.current().set_skew(skew)
                claimed = self._round()
                if now >= next_serial:
                    next_serial = now + min(cfg.poll_interval, 1.0)
                    claimed += self._serial_round()
                if now >= next_status:
                    next_status = now + cfg.status_interval
                    poll_completions(self.db, self.targets, self.stats, self._ask)
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
        for name, target in self.targets.items():
            if self.publisher.lanes.stuck(name):
                # its call still holds the connection (and Celery's lock): closing would wait
                # for it; the process exits without it
                log.warning("target not closed: target=%s: a call has not answered yet", name,
                            extra={"action": "target_close_skipped"})
                continue
            try:
                target.close()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the stop
                log.warning("target close failed: target=%s error=%s", target.name, exc,
                            extra={"action": "target_close_failed"})
        self.publisher.lanes.close()
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

    def _claim(self) -> tuple[list[OutboxJob], float]:
        """One claim (on the calling thread's kept connection) and when it was made."""
        cfg = self.config
        claimed_at = clock.monotonic()
        with self.db.statement("claiming jobs") as conn:
            jobs = outbox_claims.outbox_claim(
                conn, worker_id=self.relay_id, limit=cfg.batch_size, lease_margin=0.0,
                exclude_tasks=["command"], routes=self.routes, lease=cfg.lease,
            )
        return jobs, claimed_at

    def _ask(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A status question to target ``name`` on its lane (``relay.lanes``), waited for a
        quarter of the lease at most: the batch claimed ahead must not age past its lease."""
        return self.publisher.lanes.call(name, clock.monotonic() + self.config.lease / 4, fn,
                                         *args)

    def _round(self) -> int:
        """Publish one batch. A full batch means more is probably waiting: the next claim then
        runs on the claimer thread while this batch is published (one batch ahead at most, its
        lease counted from its own claim)."""
        if self.routes.tasks == () or len(self.publisher.resting()) == len(self.targets):
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

    def _renewed(self, jobs: list[OutboxJob], claimed_at: float
                 ) -> tuple[list[OutboxJob], float]:
        """A batch claimed ahead waited while the previous one was published: renew its leases
        (the workers' heartbeat statement) so its publishing budget starts now. A job whose
        lease was lost meanwhile is left to whoever took it."""
        if not jobs or clock.monotonic() - claimed_at < 1.0:
            return jobs, claimed_at
        renewed_at = clock.monotonic()
        with self.db.statement("renewing leases") as conn:
            kept = set(outbox_claims.outbox_lease_extend(
                conn, worker_id=self.relay_id, ids=[j.id for j in jobs],
                attempts=[j.attempt for j in jobs], margin=self.config.lease))
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
            names = outbox_claims.outbox_serial_candidates(
                conn, limit=self.config.batch_size, exclude_tasks=["command"], routes=self.routes)
        claimed = 0
        for name in names:
            key = serial_lock_key(self.schema, name)
            with self.db.transaction("claiming a serial job") as conn:
                job = outbox_claims.outbox_claim_serial(
                    conn, schedule=name, lock_key=key, worker_id=self.relay_id, lease_margin=0.0,
                    lease=self.config.lease)
            if job is not None:
                claimed += 1
                self._publish_and_record([job], clock.monotonic())
        return claimed

    # -- publish ---------------------------------------------------------------------------

    def _publish_and_record(self, jobs: list[OutboxJob], claimed_at: float) -> None:
        self.stats["claimed"] += len(jobs)
        self.recorder.put(self.publisher.publish(jobs, claimed_at))
