"""The seam every relay target implements, and the target ids derived from idempotency keys.

A target module exposes ``build(name: str, settings: Mapping[str, Any]) -> Target``, where
``settings`` is the target's table from the relay config (``kind`` included), and may expose
``check(settings) -> list[tuple[str, str]]`` ((key, message) problems, for ``cronkeeper validate
--relay-config``; it must not import its queue library at module import). A target may set
``reports_completion = False`` when ``status`` can only ever answer ``UNKNOWN`` (Celery without a
result backend): the relay then does not poll it. A target may also offer
``status_many(target_ids) -> list[Completion]`` (same order), which the relay prefers: one round
trip for a whole poll instead of one per job; and ``publish_many(items: list[tuple[RelayJob,
Delivery]]) -> list[str | PublishError]`` (a target id or that job's failure, same order; raises
when the whole call failed), which the relay uses to publish a round's jobs in one round trip.
The relay calls
``publish`` once per claimed job and ``status`` for published jobs whose schedule needs to know
when they finished (overlap ``skip`` and ``serial``).

Target ids are pure functions of the idempotency key, so a job republished after a crash between
publish and mark carries the same id at the target (docs/relay.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from cronkeeper.errors import CronkeeperError


@dataclass(frozen=True, slots=True)
class RelayJob:
    """One claimed outbox job, as a target sees it."""

    id: int
    key: str
    schedule: str | None
    scheduled_for: datetime | None
    task: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int
    timeout: float
    run_after: datetime
    created_at: datetime
    # Seconds until ``run_after`` by the database's clock, as the relay reckons it (its host's
    # clock plus its measured skew); None: judge ``run_after`` by this host's clock.
    due_in: float | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    """Where a route sends a job: the target's queue (None: the target's default) and the
    route's extra options (target specific, checked by the target's ``build``/``publish``)."""

    queue: str | None = None
    options: tuple[tuple[str, Any], ...] = ()


class Completion(StrEnum):
    """What a target can tell about a published job."""

    UNKNOWN = "unknown"  # the target cannot tell (no result backend, expired, not supported)
    PENDING = "pending"  # published, not finished
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # finished for good without success (the target's own dead letter)


class PublishError(CronkeeperError):
    """Publishing failed or its outcome is ambiguous (confirm timeout): retried with the same
    target id, with backoff and full jitter, up to the job's attempts."""


class PermanentPublishError(PublishError):
    """No retry can succeed (the target refuses the job as malformed): dead letter at once."""


class TargetUnavailable(PublishError):
    """No connection to the target could be made, or the target does not answer at all within
    its timeout: not the job's fault, so the relay hands the job back without counting an
    attempt and rests the target before trying it again (docs/relay.md, "Failures"). A job that
    may have landed meanwhile is republished later under the same target id (at least once).
    Not for a failure the message itself may cause (a connection the broker closes on it)."""


class Target(Protocol):
    name: str

    def publish(self, job: RelayJob, delivery: Delivery) -> str:
        """Hand the job to the target; return its id there once the target acknowledged it.
        Publishing a job whose id the target already holds is not an error."""
        ...

    def status(self, target_id: str) -> Completion: ...

    def close(self) -> None: ...


class BatchPublisher(Protocol):
    """A target that also offers ``publish_many`` (see the module's docstring)."""

    def publish_many(self, items: list[tuple[RelayJob, Delivery]]) -> list[str | PublishError]: ...


def publish_one(target: BatchPublisher, job: RelayJob, delivery: Delivery) -> str:
    """``publish`` for a target whose way to publish is ``publish_many``: a batch of one, its
    failure raised."""
    result = target.publish_many([(job, delivery)])[0]
    if isinstance(result, PublishError):
        raise result
    return result


# -- target ids ----------------------------------------------------------------------------

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def safe_id(key: str) -> str:
    """A reversible encoding of ``key`` in letters, digits, ``-`` and ``_``: every other byte
    of its UTF-8 form (``_`` included) becomes ``_`` and two lowercase hex digits.
    ``nightly@2026-03-08T07:00:00Z`` -> ``nightly_402026-03-08T07_3a00_3a00Z``."""
    out = []
    for ch in key:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8"))
    return "".join(out)


def unsafe_id(encoded: str) -> str:
    """The key back from :func:`safe_id`."""
    raw = bytearray()
    i = 0
    while i < len(encoded):
        if encoded[i] == "_":
            raw.append(int(encoded[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(encoded[i].encode("ascii"))
            i += 1
    return raw.decode("utf-8")


def celery_task_id(key: str) -> str:
    return key


def rq_job_id(key: str) -> str:
    return safe_id(key)


def bullmq_job_id(key: str) -> str:
    """``ck-`` + :func:`safe_id`: never holds ``:`` and is never integer-like."""
    return "ck-" + safe_id(key)


def sidekiq_jid(key: str) -> str:
    """24 lowercase hex characters: the start of the key's SHA-256."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]
