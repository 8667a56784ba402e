"""Decided periods as the claim tests write them (one row each, with its job's columns and the
key the job must get), and the claim batches they make (db/periods_claims.py)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple

from cronkeeper.db.periods_claims import Claim, ClaimBatch, ClaimGroup, JobColumns


class Row(NamedTuple):
    """One decided period; an emitted one (``key`` given: the key its job must get) carries its
    job's columns."""

    schedule: str
    scheduled_for: datetime
    version_id: int
    outcome: str
    reason: str | None
    key: str | None = None
    task: str | None = None
    payload_json: str | None = None
    max_attempts: int | None = None
    run_after: datetime | None = None
    timeout: float | None = None
    backoff_json: str | None = None
    serial: bool | None = None
    owner: str | None = None

    def job(self) -> JobColumns | None:
        if self.key is None:
            return None
        return JobColumns(self.task, self.payload_json, self.max_attempts, self.timeout,
                          self.backoff_json, self.serial, self.owner)


def batch(rows: Iterable[Row], after: ClaimBatch | None = None) -> ClaimBatch:
    """The claim columns of ``rows``; with ``after``, a batch that shares its groups (as the
    batches of a tick do)."""
    out = ClaimBatch() if after is None else after.following()
    for r in rows:
        out.add(r.schedule, r.version_id, ClaimGroup(r.scheduled_for, r.outcome, r.reason, r.job()),
                r.run_after)
    return out


def flat(claimed: list[tuple[ClaimBatch, list[Claim]]]) -> list[Claim]:
    """The claims of every batch, in order."""
    return [c for _, got in claimed for c in got]
