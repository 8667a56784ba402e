"""Jobs the relay published, until their consumer ran them: every ``status_interval`` the relay
asks the targets that can tell (``reports_completion``) about published jobs still inside their
timeout, and records ``succeeded`` / ``dead`` with ``finished_at`` (docs/relay.md)."""

from __future__ import annotations

from cronkeeper.claiming import ClaimingDatabase
from cronkeeper.db import outbox
from cronkeeper.relay.targets.base import Completion, Target

_STATUS_BATCH = 500  # most published jobs asked about per status round


def poll_completions(db: ClaimingDatabase, targets: dict[str, Target],
                     stats: dict[str, int]) -> None:
    """One status round: ask, then record what the targets know to be finished."""
    asking = [name for name, t in targets.items() if getattr(t, "reports_completion", True)]
    if not asking:
        return
    with db.statement("reading published jobs") as conn:
        open_jobs = outbox.outbox_published_open(conn, targets=asking, limit=_STATUS_BATCH)
    by_target: dict[str, list[outbox.Published]] = {}
    for job in open_jobs:
        by_target.setdefault(job.target, []).append(job)
    ids, states = [], []
    for name, jobs in by_target.items():
        target = targets[name]
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
        note = db.has(db.notes)
        with db.statement("recording completions") as conn:
            n = outbox.outbox_published_finish(conn, ids=ids, states=states, note=note)
        stats["finished"] += n
