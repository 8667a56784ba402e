"""The RQ target: enqueue each job by dotted function name, with a deterministic job id and
``unique=True`` so a republish of the same job is refused by RQ itself (docs/feeding-rq.md).

- function: the job's task as a dotted path (``billing.jobs:send`` is sent as
  ``billing.jobs.send``); kwargs: the payload; serializer: RQ's JSONSerializer (workers run with
  ``--serializer rq.serializers.JSONSerializer``); ``meta["idempotency_key"]``: the key.
- job id: :func:`rq_job_id` (a reversible encoding of the key in RQ's id alphabet).
- ``run_after`` in the future: ``enqueue_at`` (RQ's scheduler, ``rq worker --with-scheduler``).
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
from typing import Any

from cronkeeper.relay.targets import _redis as r
from cronkeeper.relay.targets.base import (
    Completion,
    Delivery,
    PermanentPublishError,
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

    def _queue(self, name: str):
        queue = self._queues.get(name)
        if queue is None:
            from rq import Queue

            queue = Queue(name, connection=self._redis, serializer=self._serializer)
            self._queues[name] = queue
        return queue

    def publish(self, job: RelayJob, delivery: Delivery) -> str:
        from rq.exceptions import DuplicateJobError

        options = r.route_options(self.name, delivery, ROUTE_OPTIONS)
        job_id = rq_job_id(job.key)
        queue = self._queue(delivery.queue or self.queue_name)
        call: dict[str, Any] = {
            "kwargs": dict(job.payload),
            "job_id": job_id,
            "unique": True,
            "meta": {"idempotency_key": job.key},
            "result_ttl": options.get("result_ttl", self.result_ttl),
            "failure_ttl": self.failure_ttl,
            "description": job.key,
            "at_front": bool(options.get("at_front", False)),
        }
        if job.timeout and job.timeout > 0:
            call["timeout"] = math.ceil(job.timeout)
        func = function_name(job.task)
        delay = r.delay_seconds(job.run_after)
        with r.publishing(self.name, f"enqueue {job_id} on {r.redacted(self.url)}"):
            try:
                if delay > 0:
                    queue.enqueue_at(job.run_after, func, **_at_kwargs(call))
                else:
                    queue.enqueue_call(func, **call)
            except DuplicateJobError:
                pass  # an earlier publish of this job landed: RQ holds it under the same id
        return job_id

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


def _at_kwargs(call: dict[str, Any]) -> dict[str, Any]:
    """``enqueue_at`` takes RQ's options as keyword arguments beside ``args``/``kwargs``."""
    out = dict(call)
    out["job_timeout"] = out.pop("timeout", None)
    return out


def build(name: str, settings: Mapping[str, Any]) -> RQTarget:
    return RQTarget(name, settings)

