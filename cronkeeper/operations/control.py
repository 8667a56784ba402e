"""What an operator does to a schedule: pause, resume, trigger, backfill (the CLI's commands and
the web's actions). They write through the same statements as the leader; backfill claims
periods through the leader's one claim path (``periods_claim``), under the same unique
constraint, so it never duplicates a period that has an outcome."""

from __future__ import annotations

import difflib
import itertools
from datetime import UTC, datetime

from cronkeeper.db.engine import Engine, RawConnection, driver, translate_errors
from cronkeeper.db.outbox import outbox_insert_manual
from cronkeeper.db.periods import periods_decided
from cronkeeper.db.periods_claims import ClaimBatch, periods_claim
from cronkeeper.db.runtime_schedules import runtime_hold
from cronkeeper.db.schedule_controls import controls_lock, controls_set
from cronkeeper.db.schedule_pauses import pauses_begin, pauses_end
from cronkeeper.db.schedule_versions import VersionRow, versions_all, versions_in_force
from cronkeeper.db.sessions import db_now
from cronkeeper.errors import CronkeeperError, UsageError
from cronkeeper.planning import Decision, Outcome, Reason, manual_key
from cronkeeper.schedule.diagnostics import safe
from cronkeeper.schedule.model import read_stored_version
from cronkeeper.scheduler import claim_add
from cronkeeper.versions import RUNTIME_ORIGIN, job_columns, stored_spec

BACKFILL_LIMIT = 100_000
OPERATOR_TERM = 0  # periods written by operator commands carry term 0


def live_version(conn: RawConnection, name: str) -> VersionRow:
    """The version in force of schedule ``name``, or an error that says why there is none (with
    a did-you-mean)."""
    versions = versions_in_force(conn)
    live = {v.schedule: v for v in versions if v.spec is not None}
    if name in live:
        return live[name]
    hint = difflib.get_close_matches(name, list(live), n=1)
    suffix = f"; did you mean {hint[0]!r}?" if hint else ""
    gone = [v for v in versions if v.schedule == name]
    if gone:
        how = ("deleted at runtime" if gone[0].origin == RUNTIME_ORIGIN
               else "removed from the schedule files")
        raise CronkeeperError(f"schedule {safe(name)!r} was {how}{suffix}")
    raise CronkeeperError(
        f"no schedule {safe(name)!r} is known to the cluster (a leader records schedules "
        f"when it loads them){suffix}"
    )


def fenced_version(conn: RawConnection, name: str) -> VersionRow:
    """``live_version`` for a claim (``backfill``, ``trigger``): a runtime schedule's row is
    held against a delete until the transaction ends (``runtime_hold``, the fence of SPEC
    §15), and one deleted, or deleted and put again, since the leader last adopted it is
    refused: nothing is emitted for it after the delete's commit, even before a leader has
    recorded the removal (or when no leader runs)."""
    version = live_version(conn, name)
    if version.origin != RUNTIME_ORIGIN:
        return version
    held = runtime_hold(conn, name)
    if held is not None and held[1] is None and held[0] <= version.id:
        return version
    if held is not None and held[1] is None:  # a later incarnation: deleted, then put again
        raise CronkeeperError(
            f"schedule {safe(name)!r} was deleted and put again at runtime, and no leader has "
            f"adopted it yet: try again once one has (cronkeeper status shows the leader)")
    when = f" at {held[1].astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}" if held is not None else ""
    raise CronkeeperError(
        f"schedule {safe(name)!r} was deleted at runtime{when}: nothing of it is emitted after "
        f"its delete")


def set_paused(engine: Engine, name: str, paused: bool, who: str) -> None:
    """Pause or resume a schedule that is in force: its controls row (what ``status`` and older
    releases read) and its pause span (what the leader judges each period by, at its due
    instant), with one instant, the database's clock as late in the transaction as it can be
    taken: after the controls row is locked, so concurrent pauses and resumes of one schedule
    follow each other."""
    with translate_errors("updating the schedule"), engine.begin() as conn:
        raw = driver(conn)
        live_version(raw, name)
        was_paused, changed_at = controls_lock(raw, name)
        if paused:
            at = pauses_begin(raw, name, was_paused=was_paused, changed_at=changed_at)
        else:
            at = pauses_end(raw, name, was_paused=was_paused, changed_at=changed_at)
        controls_set(raw, name, paused, who, at)


def trigger_job(engine: Engine, name: str) -> tuple[int, str]:
    """Write one manual job for a schedule now (no period is claimed): (job id, its key)."""
    with translate_errors("writing the job"), engine.begin() as conn:
        raw = driver(conn)
        version = fenced_version(raw, name)
        spec, _ = stored_spec(version)
        now = db_now(raw)
        key = manual_key(spec.name, now)
        job_id = outbox_insert_manual(raw, key=key, schedule=spec.name, scheduled_for=now,
                                      version_id=version.id, run_after=now, job=job_columns(spec))
        return job_id, key


def check_window(after: datetime, until: datetime) -> None:
    if until <= after:
        raise UsageError("--to must be later than --from")


def backfill(engine: Engine, name: str, after: datetime, until: datetime, *,
             dry_run: bool) -> list[datetime]:
    """Emit the periods of ``name`` in ``(after, until]`` (never past now: a period is never
    decided before it is due) that have no outcome yet, each by the version in force at its
    instant; return their instants, sorted. ``dry_run``: which, with nothing written."""
    check_window(after, until)
    with translate_errors("backfilling"), engine.begin() as conn:
        raw = driver(conn)
        fenced_version(raw, name)  # (a delete committed later waits for this transaction)
        until = min(until, db_now(raw))
        batch = ClaimBatch()
        chosen: list[datetime] = []
        versions = versions_all(raw, [name])  # oldest first
        decided = periods_decided(raw, name, after, until)
        for (version_id, _, stored, active_from), following in itertools.zip_longest(
                versions, versions[1:]):
            if stored is None:  # removed for a while
                continue
            spec, trigger = read_stored_version(name, version_id, stored)
            lo = max(after, active_from)
            hi = min(until, following[3]) if following else until
            if hi <= lo:
                continue
            periods = []
            for period in trigger.fires(lo, hi):
                if period not in decided:
                    periods.append(period)
                if len(chosen) + len(periods) > BACKFILL_LIMIT:
                    raise UsageError(f"more than {BACKFILL_LIMIT} periods: backfill a shorter window")
            chosen.extend(periods)
            claim_add(batch, spec, version_id,
                      (Decision(p, Outcome.EMITTED, Reason.BACKFILL) for p in periods))
        if dry_run:
            return sorted(chosen)
        claimed = periods_claim(raw, [batch], OPERATOR_TERM)
        return sorted(c[1].astimezone(UTC) for _, got in claimed for c in got)
