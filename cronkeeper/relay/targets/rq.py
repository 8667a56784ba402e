"""The RQ target: enqueue each job by dotted function name, with a deterministic job id and
``unique=True`` so a republish of the same job is refused by RQ itself (docs/feeding-rq.md).

- function: the job's task as a dotted path (``billing.jobs:send`` is sent as
  ``billing.jobs.send``); kwargs: the payload; serializer: RQ's JSONSerializer (workers run with
  ``--serializer rq.serializers.JSONSerializer``); ``meta["idempotency_key"]``: the key.
- job id: :func:`rq_job_id` (a reversible encoding of the key in RQ's id alphabet).
- ``run_after`` in the future: ``enqueue_at`` (RQ's scheduler, ``rq worker --with-scheduler``).
- A relay round goes through ``publish_many``: its jobs due now in one pipelined round trip,
  each saved by RQ's own unique-enqueue Lua script (what ``enqueue_call(..., unique=True)``
  runs, one job at a time and two round trips each); see ``publish_many``.
- A duplicate id (``DuplicateJobError``) means an earlier publish landed: already published.
  RQ forgets a job ``result_ttl`` seconds after it finished (``failure_ttl`` after it failed);
  after that the same id is accepted again, so the setting defaults to a day, far above the relay
  lease that bounds a republish.

Settings (``[targets.NAME]``): ``redis`` (URL), ``queue`` (default ``default``),
``result_ttl`` (s, default 86400), ``failure_ttl`` (s, default RQ's), ``socket_timeout``
(s, default 5). Route options: ``result_ttl``, ``at_front``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, cast

from cronkeeper.relay.targets import _redis as r
from cronkeeper.relay.targets.base import (
    Completion,
    Delivery,
    PermanentPublishError,
    PublishError,
    RelayJob,
    rq_job_id,
)

SETTINGS: dict[str, r.Rule] = {
    "redis": r.redis_url, "queue": r.text, "result_ttl": r.integer(1),
    "failure_ttl": r.integer(1), "socket_timeout": r.seconds,
}
ROUTE_OPTIONS: dict[str, r.Rule] = {"result_ttl": r.integer(1), "at_front": r.boolean}
DEFAULT_RESULT_TTL = 86_400
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")

_STATES = {
    "finished": Completion.SUCCEEDED,
    "failed": Completion.FAILED,
    "stopped": Completion.FAILED,
    "canceled": Completion.FAILED,
}


def function_name(task: str) -> str:
    """``pkg.mod:func`` or ``pkg.mod.func`` -> ``pkg.mod.func``; anything else is refused."""
    dotted = task.replace(":", ".", 1) if task.count(":") == 1 else task
    if not _DOTTED.fullmatch(dotted):
        raise PermanentPublishError(
            f"task {task!r} is not a dotted function path (package.module.function) RQ can import"
        )
    return dotted


def check(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    return r.check_settings(settings, SETTINGS)


class RQTarget:
    def __init__(self, name: str, settings: Mapping[str, Any]) -> None:
        r.require_valid(name, check(settings))
        self.name = name
        self.url = settings.get("redis", r.DEFAULT_REDIS)
        self.queue_name = settings.get("queue", "default")
        self.result_ttl = settings.get("result_ttl", DEFAULT_RESULT_TTL)
        self.failure_ttl = settings.get("failure_ttl")
        timeout = settings.get("socket_timeout", 5)
        from rq.serializers import JSONSerializer

        self._serializer = JSONSerializer
        self._redis = r.redis_client(self.url, float(timeout))
        self._queues: dict[str, Any] = {}
        self._parts = _unique_parts(self._redis)

    def _queue(self, name: str):
        queue = self._queues.get(name)
        if queue is None:
            from rq import Queue

            queue = Queue(name, connection=self._redis, serializer=self._serializer)
            self._queues[name] = queue
        return queue

    def _call(self, job: RelayJob, delivery: Delivery) -> tuple[str, str, dict[str, Any]]:
        """The queue, the function and RQ's ``enqueue_call`` options for this job."""
        options = r.route_options(self.name, delivery, ROUTE_OPTIONS)
        call: dict[str, Any] = {
            "kwargs": dict(job.payload),
            "job_id": rq_job_id(job.key),
            "unique": True,
            "meta": {"idempotency_key": job.key},
            "result_ttl": options.get("result_ttl", self.result_ttl),
            "failure_ttl": self.failure_ttl,
            "description": job.key,
            "at_front": bool(options.get("at_front", False)),
        }
        if job.timeout and job.timeout > 0:
            call["timeout"] = math.ceil(job.timeout)
        return delivery.queue or self.queue_name, function_name(job.task), call

    def publish(self, job: RelayJob, delivery: Delivery) -> str:
        from rq.exceptions import DuplicateJobError

        queue_name, func, call = self._call(job, delivery)
        job_id = call["job_id"]
        queue = self._queue(queue_name)
        delay = r.delay_seconds(job)
        with r.publishing(self.name, f"enqueue {job_id} on {r.redacted(self.url)}"):
            try:
                if delay > 0:
                    queue.enqueue_at(job.run_after, func, **_at_kwargs(call))
                else:
                    queue.enqueue_call(func, **call)
            except DuplicateJobError:
                pass  # an earlier publish of this job landed: RQ holds it under the same id
        return job_id

    def publish_many(self, items: list[tuple[RelayJob, Delivery]]) -> list[str | PublishError]:
        """The jobs due now in one pipelined round trip: per queue RQ's ``SADD rq:queues``, then
        per job RQ's own unique-enqueue Lua script (the ``Job`` built by ``Queue.create_job``,
        its hash, TTL and push exactly as ``enqueue_call(..., unique=True)`` writes them: check
        the id, save, push; atomic per job). RQ runs that script outside any pipeline, two round
        trips a job with its ``SADD``, and most of a job's client time goes to those two round
        trips (docs/feeding-rq.md, "Throughput"). A reply of 0 is a duplicate (an earlier publish
        landed). A job whose script failed in Redis, or that could not be built, is that job's
        failure; the others go. Jobs whose ``run_after`` is still ahead go one by one through
        ``enqueue_at``, and every job does when this RQ lacks the script (see ``_unique_parts``).
        A connection lost during the round trip fails the whole call: which jobs landed is
        unknown, and a republish of those is absorbed by ``unique``."""
        import redis
        from redis.exceptions import NoScriptError

        results: list[str | PublishError | None] = [None] * len(items)
        one_by_one: list[int] = []
        sent: list[tuple[int | None, str, list[Any]]] = []  # per command: item (None: the queue's
        # SADD), queue, the script's KEYS + ARGV
        parts = self._parts
        with r.publishing(self.name, f"enqueue {len(items)} jobs on {r.redacted(self.url)}"):
            pipe = self._redis.pipeline(transaction=False)
            registered: set[str] = set()
            for i, (job, delivery) in enumerate(items):
                if parts is None or r.delay_seconds(job) > 0:
                    one_by_one.append(i)
                    continue
                try:
                    queue_name, func, call = self._call(job, delivery)
                    queue = self._queue(queue_name)
                    keys_args = _script_keys_args(queue, func, call, parts[1])
                except redis.RedisError:
                    raise  # Redis itself failed (RQ asks its version once): the whole call
                except PublishError as exc:
                    results[i] = exc
                    continue
                except Exception as exc:  # noqa: BLE001 - RQ refused to build this one job
                    results[i] = PublishError(
                        f"target '{self.name}': job {job.key}: {type(exc).__name__}: {exc}")
                    continue
                if queue_name not in registered:
                    registered.add(queue_name)
                    pipe.sadd(queue.redis_queues_keys, queue.key)
                    sent.append((None, queue_name, []))
                # EVALSHA itself, not the Script object: with one, redis-py would first ask
                # SCRIPT EXISTS, a second round trip for every batch.
                pipe.evalsha(parts[0].sha, 2, *keys_args)
                sent.append((i, queue_name, keys_args))
            replies = pipe.execute(raise_on_error=False) if sent else []
            # Redis no longer holds the script (restarted, SCRIPT FLUSH): a NOSCRIPT reply ran
            # nothing, so load it and send those jobs again.
            again = [k for k, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
            if again and parts is not None:
                self._redis.script_load(parts[0].script)
                pipe = self._redis.pipeline(transaction=False)
                for k in again:
                    pipe.evalsha(parts[0].sha, 2, *sent[k][2])
                for k, reply in zip(again, pipe.execute(raise_on_error=False), strict=True):
                    replies[k] = reply
        unregistered: dict[str, Exception] = {}
        for (item, queue_name, _), reply in zip(sent, replies, strict=True):
            if item is None:
                if isinstance(reply, Exception):
                    unregistered[queue_name] = reply
                continue
            job_id = rq_job_id(items[item][0].key)
            error = reply if isinstance(reply, Exception) else unregistered.get(queue_name)
            if error is None and reply not in (0, 1):
                error = ValueError(f"unexpected reply {reply!r}")
            results[item] = job_id if error is None else PublishError(
                f"target '{self.name}': enqueue {job_id} failed: {type(error).__name__}: {error}")
        for i in one_by_one:
            try:
                results[i] = self.publish(*items[i])
            except PublishError as exc:
                results[i] = exc
            except Exception as exc:  # noqa: BLE001 - this job's failure, not the batch's
                results[i] = PublishError(
                    f"target '{self.name}': job {items[i][0].key}: {type(exc).__name__}: {exc}")
        return cast(list[str | PublishError], results)  # every item has its outcome now

    def status(self, target_id: str) -> Completion:
        return self.status_many([target_id])[0]

    def status_many(self, target_ids: list[str]) -> list[Completion]:
        """RQ's job status, one pipelined round trip for all. A job RQ no longer holds (expired
        after ``result_ttl``, or never published here) is UNKNOWN."""
        from rq.job import Job

        def ask() -> list[Completion]:
            with r.publishing(self.name, f"status of {len(target_ids)} jobs"):
                pipe = self._redis.pipeline(transaction=False)
                for target_id in target_ids:
                    pipe.hget(Job.key_for(target_id), "status")
                raw = pipe.execute()
            return [Completion.UNKNOWN if v is None else _STATES.get(v.decode(), Completion.PENDING)
                    for v in raw]

        return r.unknown_on_failure(self.name, target_ids, ask)

    def close(self) -> None:
        self._redis.close()


def _unique_parts(connection: Any) -> tuple[Any, Any] | None:
    """RQ's unique-enqueue Lua script (a redis-py ``Script``: its text and SHA) and RQ's builder
    of the job hash's fields: the two pieces ``enqueue_call(..., unique=True)`` ends in. Both are
    in ``rq.scripts`` in every RQ this package accepts (2.8 to 3.x); tests/test_relay_rq.py checks
    that a job saved through them is the job ``enqueue_call`` saves. None when this RQ lacks
    them: every job then goes through ``enqueue_call``."""
    try:
        from rq.queue import Queue
        from rq.scripts import UNIQUE_ENQUEUE_SCRIPT, _build_hset_args
    except ImportError:
        return None
    if not hasattr(Queue, "_prepare_for_queue"):
        return None
    return connection.register_script(UNIQUE_ENQUEUE_SCRIPT), _build_hset_args


def _script_keys_args(queue: Any, func: str, call: dict[str, Any], hset_args: Any) -> list[Any]:
    """KEYS (the job's hash, the queue's list) and ARGV of RQ's unique-enqueue script for one
    job, built as ``enqueue_call`` -> ``enqueue_job`` -> ``_enqueue_async_job`` ->
    ``save_unique_job`` build them (RQ 2.8 to 3.x): ``create_job`` with status queued,
    ``_prepare_for_queue`` (origin, ``enqueued_at``, timeout, status), then the job's id, the push
    side, the TTL (-1: none) and the hash's fields."""
    from rq.job import JobStatus

    options = {k: v for k, v in call.items() if k not in ("unique", "at_front")}
    job = queue.create_job(func, status=JobStatus.QUEUED, **options)
    queue._prepare_for_queue(job)  # noqa: SLF001 - the step enqueue_call takes before saving
    ttl = job.ttl if job.ttl is not None else -1
    push = "L" if call["at_front"] else "R"
    return [job.key, queue.key, job.id, push, ttl, *hset_args(job)]


def _at_kwargs(call: dict[str, Any]) -> dict[str, Any]:
    """``enqueue_at`` takes RQ's options as keyword arguments beside ``args``/``kwargs``."""
    out = dict(call)
    out["job_timeout"] = out.pop("timeout", None)
    return out


def build(name: str, settings: Mapping[str, Any]) -> RQTarget:
    return RQTarget(name, settings)

