"""The Sidekiq target: plain Redis writes in Sidekiq's documented job format (the Job-Format page
of Sidekiq's wiki), exactly what ``Sidekiq::Client#atomic_push`` writes, so Ruby workers run the
jobs unchanged (docs/feeding-sidekiq.md).

Due now: ``SADD queues <queue>`` and ``LPUSH queue:<queue> <json>``; ``run_after`` in the
future: ``ZADD schedule <at> <json>`` (the scheduled form carries no ``enqueued_at``). A relay
round's jobs go in one MULTI/EXEC (``publish_many``): they land together or not at all. The JSON
object:
``class`` (the task), ``args`` (``[payload]``, or the payload's values in the order a route's
``args`` option names), ``jid`` (:func:`sidekiq_jid`), ``queue``, ``retry``, ``created_at``,
``enqueued_at`` and ``idempotency_key``.

Timestamps: ``timestamps = "seconds"`` (float epoch seconds, as Sidekiq 6 and 7 write them; the
default, because Sidekiq 8 still reads that form) or ``"milliseconds"`` (integer epoch ms, as
Sidekiq 8 writes them). The ``schedule`` score is float seconds in every version.

Sidekiq does not dedupe by jid. ``status()`` and dedupe need the optional server middleware in
``contrib/sidekiq/cronkeeper_middleware.rb``, which records each jid's run under
``cronkeeper:sidekiq:<jid>``; without it, ``status()`` is UNKNOWN.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from cronkeeper import clock
from cronkeeper.relay.targets import _redis as r
from cronkeeper.relay.targets.base import (
    Completion,
    Delivery,
    PermanentPublishError,
    PublishError,
    RelayJob,
    publish_one,
    sidekiq_jid,
)

TIMESTAMPS = ("seconds", "milliseconds")


def _retry(value: Any) -> str | None:
    ok = isinstance(value, bool) or (isinstance(value, int) and value >= 0)
    return None if ok else "must be true, false or a count >= 0"


def _args(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    return None if ok else "must be a list of payload keys"


SETTINGS: dict[str, r.Rule] = {
    "redis": r.redis_url, "queue": r.text, "retry": _retry,
    "timestamps": r.one_of(*TIMESTAMPS), "status_prefix": r.text, "middleware": r.boolean,
    "socket_timeout": r.seconds,
}
ROUTE_OPTIONS: dict[str, r.Rule] = {"retry": _retry, "timestamps": r.one_of(*TIMESTAMPS),
                                    "args": _args}
STATUS_PREFIX = "cronkeeper:sidekiq:"  # the middleware's default (CRONKEEPER_SIDEKIQ_PREFIX)

_STATES = {b"succeeded": Completion.SUCCEEDED, b"failed": Completion.FAILED}


def stamp(at: datetime, timestamps: str) -> float | int:
    """An instant as Sidekiq writes it: float epoch seconds (6, 7) or integer epoch ms (8)."""
    seconds = at.timestamp()
    return round(seconds * 1000) if timestamps == "milliseconds" else float(seconds)


def job_args(payload: Mapping[str, Any], names: list[str] | None) -> list[Any]:
    """``[payload]`` (one hash argument), or the named payload values as positional args."""
    if names is None:
        return [dict(payload)]
    missing = [n for n in names if n not in payload]
    if missing:
        raise PermanentPublishError(f"payload has no {', '.join(map(repr, missing))} for args")
    return [payload[n] for n in names]


def job_hash(job: RelayJob, queue: str, *, retry: bool | int, timestamps: str,
             args: list[str] | None, now: datetime, scheduled: bool) -> dict[str, Any]:
    """The job hash Sidekiq's client would write (without ``enqueued_at`` when scheduled)."""
    item: dict[str, Any] = {
        "class": job.task,
        "args": job_args(job.payload, args),
        "jid": sidekiq_jid(job.key),
        "queue": queue,
        "retry": retry,
        "created_at": stamp(now, timestamps),
        "idempotency_key": job.key,
    }
    if not scheduled:
        item["enqueued_at"] = stamp(now, timestamps)
    return item


def check(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    return r.check_settings(settings, SETTINGS)


class SidekiqTarget:
    def __init__(self, name: str, settings: Mapping[str, Any]) -> None:
        r.require_valid(name, check(settings))
        self.name = name
        self.url = settings.get("redis", r.DEFAULT_REDIS)
        self.queue = settings.get("queue", "default")
        self.retry = settings.get("retry", True)
        self.timestamps = settings.get("timestamps", "seconds")
        self.status_prefix = settings.get("status_prefix", STATUS_PREFIX)
        # middleware = false: no server records completion, so the relay need not ask.
        self.reports_completion = settings.get("middleware", True)
        self._redis = r.redis_client(self.url, float(settings.get("socket_timeout", 5)))

    def publish(self, job: RelayJob, delivery: Delivery) -> str:
        return publish_one(self, job, delivery)

    def publish_many(self, items: list[tuple[RelayJob, Delivery]]) -> list[str | PublishError]:
        """Every job in one MULTI/EXEC: the batch lands whole or not at all. A job that cannot
        be encoded is that job's failure; the others go."""
        now = clock.wall()
        results: list[str | PublishError] = []
        pipe = self._redis.pipeline(transaction=True)
        queues: set[str] = set()
        for job, delivery in items:
            try:
                jid, queue, body, scheduled = self._encode(job, delivery, now)
            except PublishError as exc:
                results.append(exc)
                continue
            if job.attempt == 1:
                # A first claim was never published before, unless it is a replayed dead letter:
                # forget the middleware's old "failed" record, so the copy runs and is reported.
                pipe.delete(self.status_prefix + jid)
            if scheduled:
                pipe.zadd("schedule", {body: job.run_after.timestamp()})
            else:
                if queue not in queues:
                    pipe.sadd("queues", queue)
                    queues.add(queue)
                pipe.lpush(f"queue:{queue}", body)
            results.append(jid)
        if len(pipe):
            with r.publishing(self.name, f"push {len(items)} jobs to {r.redacted(self.url)}"):
                pipe.execute()
        return results

    def _encode(self, job: RelayJob, delivery: Delivery, now: datetime) -> tuple[str, str, str, bool]:
        options = r.route_options(self.name, delivery, ROUTE_OPTIONS)
        queue = delivery.queue or self.queue
        scheduled = r.delay_seconds(job) > 0
        item = job_hash(
            job, queue, retry=options.get("retry", self.retry),
            timestamps=options.get("timestamps", self.timestamps), args=options.get("args"),
            now=now, scheduled=scheduled,
        )
        try:
            body = json.dumps(item, separators=(",", ":"), allow_nan=False)
        except ValueError as exc:
            raise PermanentPublishError(f"job {job.key}: payload is not strict JSON: {exc}") from exc
        return item["jid"], queue, body, scheduled

    def status(self, target_id: str) -> Completion:
        return self.status_many([target_id])[0]

    def status_many(self, target_ids: list[str]) -> list[Completion]:
        """The middleware's records, one MGET for all: ``succeeded``, ``failed``, or
        ``running:<token>`` while a server runs the jid. No record (not started yet, no
        middleware, expired) is UNKNOWN: the timeout bound applies."""
        def ask() -> list[Completion]:
            with r.publishing(self.name, f"status of {len(target_ids)} jobs"):
                raw = self._redis.mget([self.status_prefix + t for t in target_ids])
            return [Completion.UNKNOWN if v is None else _STATES.get(v, Completion.PENDING)
                    for v in raw]

        return r.unknown_on_failure(self.name, target_ids, ask)

    def close(self) -> None:
        self._redis.close()


def build(name: str, settings: Mapping[str, Any]) -> SidekiqTarget:
    return SidekiqTarget(name, settings)
