"""The BullMQ target, through the official Python ``bullmq`` package: ``Queue.add(name, data,
{"jobId": ..., "delay": ...})``, so Node workers run the jobs unchanged (docs/feeding-bullmq.md).

- job name: the task; data: the payload; ``jobId``: :func:`bullmq_job_id` (``ck-`` + a
  reversible encoding of the key). BullMQ refuses ids holding ``:`` and integer-like ids, and the
  Python client does not check, so this module does before anything is sent.
- ``delay``: milliseconds until ``run_after`` when it is still in the future.
- A duplicate ``jobId``: BullMQ keeps the job it holds and returns its id, exactly as for a new
  job. For a job claimed before (the only kind that can have been published before), the target
  asks ``EXISTS`` first, so it knows the publish was a duplicate (counted, logged) and treats it
  as already published; a first attempt costs one ``Queue.add``.
- ``removeOnComplete = {"age": keep_completed}`` (default one day, never below the relay's
  60 s lease): a republish after the job finished still meets the job and is absorbed.
- ``attempts`` and ``backoff``: BullMQ's own, left to the queue's defaults or set per route.
- target id: the job id, or ``<queue>/<job id>`` for a queue other than the target's default.

bullmq is asyncio; the relay is synchronous. The target owns one event loop on a private thread
and hands it each call (``run_coroutine_threadsafe``) with a deadline, so the relay never awaits.

Settings: ``redis`` (URL), ``queue`` (default ``default``), ``prefix`` (default ``bull``),
``keep_completed`` (s), ``attempts``, ``backoff`` (table), ``socket_timeout`` (s, default 5).
Route options: ``attempts``, ``backoff``, ``priority``, ``keep_completed``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine, Mapping
from typing import Any

from cronkeeper.relay.targets import _redis as r
from cronkeeper.relay.targets.base import (
    Completion,
    Delivery,
    PermanentPublishError,
    PublishError,
    RelayJob,
    TargetUnavailable,
    bullmq_job_id,
    publish_one,
)

log = logging.getLogger("cronkeeper.relay.bullmq")

DEFAULT_KEEP_COMPLETED = 86_400
MIN_KEEP_COMPLETED = 60  # the relay's default lease: a republish comes within it


def _keep(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_KEEP_COMPLETED:
        return (f"must be whole seconds >= {MIN_KEEP_COMPLETED} (the relay's lease; a shorter "
                "one lets a republish run twice)")
    return None


def _prefix(value: Any) -> str | None:
    return None if isinstance(value, str) and value and ":" not in value else \
        "must be a non-empty name without ':'"


SETTINGS: dict[str, r.Rule] = {
    "redis": r.redis_url, "queue": r.text, "prefix": _prefix, "keep_completed": _keep,
    "attempts": r.integer(1), "backoff": r.table, "socket_timeout": r.seconds,
}
ROUTE_OPTIONS: dict[str, r.Rule] = {
    "attempts": r.integer(1), "backoff": r.table, "priority": r.integer(0),
    "keep_completed": _keep,
}

def check_job_id(job_id: str) -> str:
    """BullMQ's rules for custom ids: no ``:`` (its key separator), not an integer (those are
    its own counter's ids)."""
    if not job_id or ":" in job_id or job_id.lstrip("-").isdigit():
        raise PermanentPublishError(f"BullMQ refuses the job id {job_id!r}")
    return job_id


def check(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    return r.check_settings(settings, SETTINGS)


class _LoopThread:
    """One asyncio loop on a daemon thread; ``run`` blocks the caller until a coroutine ends."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class BullMQTarget:
    def __init__(self, name: str, settings: Mapping[str, Any]) -> None:
        r.require_valid(name, check(settings))
        self.name = name
        self.url = settings.get("redis", r.DEFAULT_REDIS)
        self.queue_name = settings.get("queue", "default")
        self.prefix = settings.get("prefix", "bull")
        self.keep_completed = settings.get("keep_completed", DEFAULT_KEEP_COMPLETED)
        self.defaults = {k: settings[k] for k in ("attempts", "backoff") if k in settings}
        self.timeout = float(settings.get("socket_timeout", 5))
        self.duplicates = 0  # publishes BullMQ absorbed (the job id was already there)
        self._loop = _LoopThread(f"bullmq-{name}")
        self._redis = self._loop.run(self._connect(), self.timeout * 2)
        self._queues: dict[str, Any] = {}

    async def _connect(self):
        import redis.asyncio as aredis

        # bullmq's own connection retries for minutes when Redis is down; the relay would rather
        # fail this publish and retry it with backoff under its own lease.
        return aredis.Redis.from_url(self.url, decode_responses=True,
                                     socket_timeout=self.timeout,
                                     socket_connect_timeout=self.timeout)

    def _queue(self, name: str):
        queue = self._queues.get(name)
        if queue is None:
            from bullmq import Queue

            async def make():
                return Queue(name, {"connection": self._redis, "prefix": self.prefix})

            queue = self._loop.run(make(), self.timeout)
            self._queues[name] = queue
        return queue

    def _call(self, what: str, coro: Coroutine[Any, Any, Any]) -> Any:
        with r.publishing(self.name, f"{what} on {r.redacted(self.url)}"):
            try:
                return self._loop.run(coro, self.timeout * 3)
            except TimeoutError as exc:  # a stuck Redis, not this job's fault (see _redis.py)
                raise TargetUnavailable(f"target '{self.name}': {what}: no answer from Redis "
                                        f"within {self.timeout * 3:g}s") from exc

    def publish(self, job: RelayJob, delivery: Delivery) -> str:
        return publish_one(self, job, delivery)

    def publish_many(self, items: list[tuple[RelayJob, Delivery]]) -> list[str | PublishError]:
        """One ``EXISTS`` pipeline for the jobs claimed before, then ``Queue.addBulk`` per queue
        (BullMQ's MULTI/EXEC): two round trips for the lot. A job whose options are wrong is that
        job's failure; the others go."""
        results: list[str | PublishError] = []
        adds: list[tuple[Any, RelayJob, dict[str, Any], int]] = []
        for job, delivery in items:
            try:
                queue_name, opts = self._options(job, delivery)
            except PublishError as exc:
                results.append(exc)
                continue
            adds.append((self._queue(queue_name), job, opts, len(results)))
            results.append(self.target_id(queue_name, opts["jobId"]))
        if adds:
            existed = self._call(f"add {len(adds)} jobs", _add_many(adds))
            for (_, job, opts, _), dup in zip(adds, existed, strict=True):
                if dup:
                    self.duplicates += 1
                    log.info("duplicate publish absorbed by BullMQ", extra={
                        "action": "relay_duplicate", "target": self.name,
                        "target_id": opts["jobId"], "key": job.key})
        return results

    def _options(self, job: RelayJob, delivery: Delivery) -> tuple[str, dict[str, Any]]:
        options = r.route_options(self.name, delivery, ROUTE_OPTIONS)
        opts: dict[str, Any] = {
            **self.defaults,
            "jobId": check_job_id(bullmq_job_id(job.key)),
            "removeOnComplete": {"age": options.get("keep_completed", self.keep_completed)},
        }
        for key in ("attempts", "backoff", "priority"):
            if key in options:
                opts[key] = options[key]
        delay = r.delay_seconds(job)
        if delay > 0:
            opts["delay"] = max(1, round(delay * 1000))
        return delivery.queue or self.queue_name, opts

    def target_id(self, queue_name: str, job_id: str) -> str:
        """The job id, prefixed with ``<queue>/`` when the job went to a queue other than the
        target's default: BullMQ keys jobs by queue, and ``status`` must find it after a relay
        restart (job ids never hold ``/``)."""
        return job_id if queue_name == self.queue_name else f"{queue_name}/{job_id}"

    def status(self, target_id: str) -> Completion:
        return self.status_many([target_id])[0]

    def status_many(self, target_ids: list[str]) -> list[Completion]:
        """Each job's state in one pipelined round trip, read as BullMQ's ``getState`` reads it
        first: in the queue's ``completed`` set -> succeeded, in ``failed`` -> failed, its hash
        still there -> still waiting, delayed or active; no hash -> UNKNOWN (removed)."""
        located = []
        for target_id in target_ids:
            queue_name, _, job_id = target_id.rpartition("/")
            located.append((self._queue(queue_name or self.queue_name), job_id))

        async def states() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for queue, job_id in located:
                pipe.zscore(queue.toKey("completed"), job_id)
                pipe.zscore(queue.toKey("failed"), job_id)
                pipe.exists(queue.toKey(job_id))
            return await pipe.execute()

        def ask() -> list[Completion]:
            raw = self._call(f"state of {len(target_ids)} jobs", states())
            out = []
            for k in range(0, len(raw), 3):
                completed, failed, exists = raw[k : k + 3]
                out.append(Completion.SUCCEEDED if completed is not None
                           else Completion.FAILED if failed is not None
                           else Completion.PENDING if exists else Completion.UNKNOWN)
            return out

        return r.unknown_on_failure(self.name, target_ids, ask)

    def close(self) -> None:
        async def shutdown() -> None:
            await self._redis.aclose()

        try:
            self._loop.run(shutdown(), self.timeout)
        finally:
            self._loop.stop()


async def _add_many(adds: list[tuple[Any, RelayJob, dict[str, Any], int]]) -> list[bool]:
    """Add the jobs; for each, whether BullMQ already held its id (then it kept that job and
    added nothing, and answered exactly as for a new one).

    Only a job claimed before can have been published before (a relay that died between
    publish and mark, a publish whose outcome was lost, a dead letter replayed), so only those
    are asked about, in one pipeline before the adds: a round of first attempts costs one
    ``addBulk`` per queue. Between the two, no other relay can add these jobs (the claim is
    exclusive); BullMQ may remove an old completed one, which only turns a "duplicate" log line
    into a fresh, correct add."""
    existed = [False] * len(adds)
    asked = [k for k, (_, job, _, _) in enumerate(adds) if job.attempt > 1]
    if asked:
        client = adds[0][0].client
        pipe = client.pipeline(transaction=False)
        for k in asked:
            queue, _, opts, _ = adds[k]
            pipe.exists(queue.toKey(opts["jobId"]))
        for k, found in zip(asked, await pipe.execute(), strict=True):
            existed[k] = bool(found)
    by_queue: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
    for queue, job, opts, _ in adds:
        entry = {"name": job.task, "data": dict(job.payload), "opts": opts}
        by_queue.setdefault(queue.name, (queue, []))[1].append(entry)
    for queue, entries in by_queue.values():
        await queue.addBulk(entries)
    return existed


def build(name: str, settings: Mapping[str, Any]) -> BullMQTarget:
    return BullMQTarget(name, settings)
