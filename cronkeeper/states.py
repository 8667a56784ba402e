"""The states and outcomes cronkeeper stores, spelled as stored (pure). Each is a ``StrEnum``,
so a member is the very string in the database and in JSON; tests/test_states.py holds each
enum equal to the CHECK constraint of its column in a migrated schema."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """``outbox.state`` (docs/outbox.md)."""

    AVAILABLE = "available"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    PUBLISHED = "published"


class AttemptOutcome(StrEnum):
    """``attempts.outcome``: how one attempt ended."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"
    DEAD = "dead"
    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    RELEASED = "released"
    PUBLISHED = "published"


class PeriodOutcome(StrEnum):
    """``periods.outcome``: what was decided for a period."""

    EMITTED = "emitted"
    SKIPPED = "skipped"
