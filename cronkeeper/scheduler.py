"""The leader's tick: take the schedules due by the database's now, plan, claim, report.

One ``Scheduler`` lives for one term (``term.Term``), on the lock session: it holds what is
in force (``versions.VersionsInForce``) and the schedules by next fire (``due.DueQueue``), and
``tick`` decides every period due. Every write transaction starts with ``Term.confirm``
(heartbeat + lock check + term check): a deposed leader cannot write. The loop that wakes it,
prunes and reloads is ``leading.LeaderLoop``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cronkeeper import versions
from cronkeeper.backoff import period_jitter
from cronkeeper.db.engine import RawConnection
from cronkeeper.db.notifications import Skipped, notifications_note_missed
from cronkeeper.db.outbox import outbox_unfinished
from cronkeeper.db.periods_claims import Claim, ClaimBatch, ClaimGroup, JobColumns, periods_claim
from cronkeeper.db.schedule_pauses import pauses_spans
from cronkeeper.db.sessions import db_now
from cronkeeper.due import DueQueue, Memo
from cronkeeper.planning import (
    Decision,
    Outcome,
    PauseSpan,
    Reason,
    idempotency_key,
    paused_at,
    plan,
)
from cronkeeper.runtime_adoption import RuntimeAdopter, held_back
from cronkeeper.schedule.model import Overlap, ScheduleSet, ScheduleSpec
from cronkeeper.term import Term
from cronkeeper.versions import ScheduleState, VersionsInForce, job_columns

# What a missed notification tells: periods skipped for want of a leader in time.
_MISSED = frozenset({Reason.MISFIRE.value, Reason.COALESCED.value})
MAX_PERIODS_PER_SCHEDULE_TICK = 5_000  # a long outage is worked off over several ticks
# One tick's transaction stays well under the stall timeout even on a loaded machine (10,000
# periods a tick tripped a 2 s --stall-timeout there: tests/test_daemon_resilience.py); a bigger
# burst is decided over consecutive ticks, each committed alone.
MAX_PERIODS_PER_TICK = 5_000
BATCH_ROWS = 1_000  # periods per batch: a chunk of the tick's COPY, or one claim statement
# A runtime schedule the claim's fence held back (``runtime_adoption.held_back``) is looked at
# again then.
FENCE_RETRY = timedelta(milliseconds=200)


@dataclass(slots=True)
class TickReport:
    now: datetime
    decisions: list[tuple[str, Decision, int | None]] = field(default_factory=list)
    lost: int = 0  # periods another leader had already decided


class Scheduler:
    def __init__(
        self,
        term: Term,
        *,
        on_tick: Callable[[TickReport], None] | None = None,
        resume_floor: timedelta = timedelta(days=400),
    ) -> None:
        self.term = term
        self.conn = term.conn
        self.on_tick = on_tick
        self.in_force = VersionsInForce(term, resume_floor)
        self.runtime = RuntimeAdopter(self.in_force)
        self._due = DueQueue()
        self._horizon: datetime | None = None  # the last tick decided every period up to here
        self.behind = False  # the last tick left due periods for the next one (a long outage)

    @property
    def states(self) -> dict[str, ScheduleState]:
        return self.in_force.states

    # -- what is in force -------------------------------------------------------------------
    def load_versions(self) -> None:
        """Plan with the versions in force in the database (``VersionsInForce.load``)."""
        self.in_force.load()
        self._refile()

    def adopt(self, schedules: ScheduleSet) -> dict[str, str]:
        """Make the file set the one in force from the last tick's horizon on (call right
        after ``tick``, which decided every period up to there under the old versions).
        Returns {schedule: 'new'|'changed'|'removed'}."""
        changes = self.in_force.adopt(schedules, self._horizon)
        if changes:
            self._refile()
        return changes

    def adopt_runtime(self) -> dict[str, str]:
        """Adopt runtime schedules' committed changes, a tick first (``runtime_adoption``)."""
        changes = self.runtime.look()
        if not changes:
            return {}
        self.tick_until_current()
        if self.behind:  # stopping mid catch-up: the next term looks again
            return {}
        done = self.runtime.record(changes, self._horizon)
        for name, state in ((n, self.states.get(n)) for n in done):
            if state is not None and state.next_fire is not None:
                self._due.push(state.next_fire, name)
        return done

    def _refile(self) -> None:
        # progress every ADOPT_ROWS schedules, as adopt does (read at call time: a test sets it)
        self._due.refill(self.in_force.states, self.term.progress, versions.ADOPT_ROWS)

    # -- ticking -------------------------------------------------------------------------------
    def next_due(self) -> datetime | None:
        return self._due.next_due()

    def tick_until_current(self) -> TickReport:
        """Tick until every period due by the last tick's now is decided: what ``adopt`` needs,
        so that no instant is left to neither the old version nor the new one."""
        report = self.tick()
        while self.behind and not self.term.stopping.is_set():
            report = self.tick()
        return report

    def tick(self) -> TickReport:
        """Decide every period due by the database's now; write outcomes and jobs."""
        now = db_now(self.conn)
        due: dict[str, Sequence[datetime]] = {}
        budget = MAX_PERIODS_PER_TICK
        self.behind = False
        # Schedules that share a trigger and a horizon (a burst of generated schedules) share
        # the calendar work: it is done once per distinct trigger, not once per schedule.
        fires = Memo(lambda trigger, after: list(
            itertools.islice(trigger.fires(after, now), MAX_PERIODS_PER_SCHEDULE_TICK)))
        states = self.states
        queue = self._due
        while (earliest := queue.earliest(now)) is not None:
            if budget <= 0:  # the rest stay in their buckets for the next tick
                self.behind = True
                break
            when, bucket = earliest
            taken = 0
            for name in bucket:  # in name order: the text indexes take the claims in order
                if budget <= 0:
                    break
                taken += 1
                state = states.get(name)
                if state is None:
                    continue
                take = min(MAX_PERIODS_PER_SCHEDULE_TICK, budget)
                periods = fires(state.trigger, state.after)
                if len(periods) > take:
                    periods = periods[:take]
                if periods:
                    due[name] = periods
                    budget -= len(periods)
                    # more due periods than one tick takes: not caught up to ``now``
                    self.behind = self.behind or len(periods) >= take
            queue.taken(when, taken)
        report = TickReport(now=now)
        horizon = now
        with self.conn.transaction():
            # (_decide advances the due schedules to their next fire as its last batch goes out)
            now, claims = (self.term.confirm(), []) if not due else self._decide(due)
        report.now = now
        self._horizon = horizon
        decided: dict[tuple[datetime, str, str | None], Decision] = {}  # frozen: shared
        for batch, claimed in claims:  # after the commit: a burst's jobs are visible sooner
            report.lost += len(batch) - len(claimed)
            for schedule, scheduled_for, outcome, reason, job_id in claimed:
                key = (scheduled_for, outcome, reason)
                decision = decided.get(key)
                if decision is None:  # in UTC whichever way it was written (COPY: as planned;
                    # the claim statement: as read back, in the session's time zone)
                    decision = decided[key] = Decision(scheduled_for.astimezone(UTC),
                                                       _OUTCOMES[outcome], _REASONS[reason])
                report.decisions.append((schedule, decision, job_id))
        if self.on_tick is not None:
            self.on_tick(report)
        return report

    def _decide(
        self, due: dict[str, Sequence[datetime]]
    ) -> tuple[datetime, list[tuple[ClaimBatch, list[Claim]]]]:
        """Plan and claim inside the tick's transaction; return its now and, per batch, the
        rows sent and the claims that came back (turned into the report after the commit)."""
        now = self.term.confirm()
        states = self.states
        for name in held_back(self.conn, states, due):  # the claim's fence: looked at again
            del due[name]
            self._due.push(now + FENCE_RETRY, name)
        paused, busy = _facts(self.conn, due, states)
        claims = periods_claim(self.conn, self._batches(due, now, paused, busy),
                               self.term.number, self.term.progress)
        missed = _missed(claims, states)
        if missed:  # told in the transaction that records them (docs/notifications.md)
            notifications_note_missed(self.conn, missed)
        return now, claims

    def _batches(
        self, due: dict[str, Sequence[datetime]], now: datetime,
        paused: dict[str, tuple[PauseSpan, ...]], busy: set[str]
    ) -> Iterator[ClaimBatch]:
        """The decisions as claim columns, planned lazily, ``BATCH_ROWS`` periods at a time.
        ``plan`` is pure, so schedules of one family with the same due periods (one list,
        shared through the tick's memo) share one plan and its claim groups (the instant, the
        decision, the job's columns): a burst's schedule costs a lookup and four appends."""
        batch = ClaimBatch()
        plans: dict[tuple, tuple[list[Decision], list[int]]] = {}
        states = self.states
        for name, periods in due.items():
            state = states[name]
            is_paused, is_busy = paused.get(name, ()), name in busy  # (spans: mostly none)
            key = (id(periods), id(state.family), is_paused, is_busy)
            planned = plans.get(key)
            if planned is None:
                decisions = plan(state.spec, periods, now, paused=is_paused, busy=is_busy)
                job = state.family.job
                planned = plans[key] = (decisions, [
                    batch.number(claim_group(d, job)) for d in decisions])
            decisions, indexes = planned
            n = len(indexes)
            if n == 1:  # the common case, without the iterators
                batch.schedule.append(name)
                batch.version_id.append(state.version_id)
                batch.group.append(indexes[0])
            else:
                batch.schedule.extend(itertools.repeat(name, n))
                batch.version_id.extend(itertools.repeat(state.version_id, n))
                batch.group.extend(indexes)
            if state.family.jitter:
                batch.run_after.extend(_jittered(name, state.family.jitter, d) for d in decisions)
            else:
                batch.run_after.extend(itertools.repeat(None, n))
            if len(batch.schedule) >= BATCH_ROWS:
                self.term.progress()  # a big tick is progress batch by batch, not at its end
                yield batch
                batch = batch.following()
        if len(batch):
            yield batch
        # Every batch is sent; the server is still writing the last ones. Advance the schedules
        # meanwhile: if the tick fails after this, the term ends and its states go with it.
        self._advance(due)

    def _advance(self, due: dict[str, Sequence[datetime]]) -> None:
        """Move each decided schedule past its periods and file it under its next fire."""
        next_fire = Memo(lambda trigger, after: trigger.next_fire(after))
        states = self.states
        for name, periods in due.items():
            state = states[name]
            state.after = periods[-1]
            state.next_fire = next_fire(state.trigger, state.after)
            if state.next_fire is not None:
                self._due.push(state.next_fire, name)


def _facts(conn: RawConnection, due: dict[str, Sequence[datetime]],
           states: dict[str, ScheduleState]) -> tuple[dict[str, tuple[PauseSpan, ...]], set[str]]:
    """What the tick's periods are judged by besides the clock: each schedule's pause spans
    that can hold one of them (pause is judged at each period's due instant, SPEC §4; none for
    a cluster that pauses nothing: two index probes), and the overlap-skip schedules whose
    previous job is unfinished (not asked of one whose every due period is paused)."""
    paused = pauses_spans(conn, min(p[0] for p in due.values())) if due else {}
    busy = outbox_unfinished(conn, [
        n for n in due if states[n].spec.overlap is Overlap.SKIP
        and not (n in paused and all(paused_at(paused[n], p) for p in due[n]))])
    return paused, busy


def _missed(claims: list[tuple[ClaimBatch, list[Claim]]],
            states: dict[str, ScheduleState]) -> list[Skipped]:
    """The periods this tick skipped because no leader was there in time (misfire,
    coalesced), per schedule: how many, and their window. Nothing to look at, and no cost,
    when no group of the tick is one of those (the batches of a tick share their groups)."""
    if not claims or not any(g.reason in _MISSED for g in claims[0][0].groups):
        return []
    found: dict[str, list[datetime]] = {}
    for _batch, claimed in claims:
        for schedule, scheduled_for, _outcome, reason, _job in claimed:
            if reason in _MISSED:
                found.setdefault(schedule, []).append(scheduled_for)
    rows = []
    for name, instants in found.items():
        spec = states[name].spec if name in states else None
        rows.append(Skipped(name, spec.task_name if spec else None,
                            spec.owner if spec else None, len(instants), min(instants),
                            max(instants)))
    return rows


def _jittered(name: str, jitter: float, decision: Decision) -> datetime | None:
    if decision.outcome is not Outcome.EMITTED:
        return None
    at = decision.scheduled_for
    return at + timedelta(seconds=period_jitter(idempotency_key(name, at), jitter))


def claim_group(decision: Decision, job: JobColumns) -> ClaimGroup:
    """The group of a decision: an emitted one carries the job's columns, a skipped one none."""
    reason = decision.reason.value if decision.reason else None  # (a backfill emits with one)
    emitted = decision.outcome is Outcome.EMITTED
    return ClaimGroup(decision.scheduled_for, decision.outcome.value, reason,
                      job if emitted else None)


def claim_add(batch: ClaimBatch, spec: ScheduleSpec, version_id: int,
              decisions: Iterable[Decision]) -> None:
    """Append decisions made outside a tick (an operator's backfill) to ``batch``: the same
    groups and jitter as the tick's (which appends its burst's columns itself, ``_batches``)."""
    job = job_columns(spec)
    for d in decisions:
        jittered = _jittered(spec.name, spec.jitter, d) if spec.jitter else None
        batch.add(spec.name, version_id, claim_group(d, job), jittered)


_OUTCOMES: dict[str, Outcome] = {o.value: o for o in Outcome}
_REASONS: dict[str | None, Reason | None] = {None: None, **{r.value: r for r in Reason}}
