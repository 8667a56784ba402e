"""Jobs the relay published, until their consumer ran them: every ``status_interval`` the relay
asks the targets that can tell (``reports_completion``) about published jobs still inside their
timeout, and records ``succeeded`` / ``dead`` with ``finished_at`` (docs/relay.md).

Each target is asked through ``call`` (the relay's lanes: on the target's own thread, waited for
until a deadline): a broker that answers a byte at a time held the relay's one loop in a status
round, publishing nothing meanwhile for any target, while the batch claimed ahead aged towards
the end of its lease. A target that does not answer in time, or whose earlier call is still
stuck, is asked again at a later round."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cronkeeper.claiming import ClaimingDatabase
from cronkeeper.db import outbox
from cronkeeper.relay.targets.base import Completion, Target, TargetUnavailable

Call = Callable[..., Any]  # call(target name, fn, *args): fn(*args), or TargetUnavailable

_STATUS_BATCH = 500  # most published jobs asked about per status round


def poll_completions(db: ClaimingDatabase, targets: dict[str, Target],
                     stats: dict[str, int], call: Call) -> None:
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
        try:
            found = call(name, _statuses, targets[name], [j.target_id for j in jobs])
        except TargetUnavailable:  # no answer in time (or still stuck): asked again later
            continue
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


def _statuses(target: Target, target_ids: list[str]) -> list[Completion]:
    """What ``target`` knows of these jobs: one round trip where it can (``status_many``)."""
    many = getattr(target, "status_many", None)
    return many(target_ids) if many is not None else [target.status(i) for i in target_ids]
