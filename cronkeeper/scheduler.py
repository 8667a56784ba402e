"""The leader's shell: wake at the next due instant, read the database's now, plan, write.

One ``Scheduler`` lives for one term, on the lock session. Every write transaction starts with
``leadership_confirm`` (heartbeat + lock check + term check): a deposed leader cannot write.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from cronkeeper.backoff import period_jitter
from cronkeeper.db import leadership as dbl
from cronkeeper.db.engine import RawConnection
from cronkeeper.db.outbox import outbox_unfinished
from cronkeeper.db.periods import periods_last
from cronkeeper.db.periods_claims import (
    Claim,
    ClaimBatch,
    ClaimGroup,
    JobColumns,
    periods_claim,
)
from cronkeeper.db.schedule_controls import controls_paused
from cronkeeper.db.schedule_versions import VersionRow, versions_in_force, versions_insert
from cronkeeper.db.sessions import db_now
from cronkeeper.errors import CronkeeperError, LeadershipLost
from cronkeeper.planning import Decision, Outcome, Reason, idempotency_key, plan
from cronkeeper.schedule.model import (
    Backoff,
    Misfire,
    Overlap,
    ScheduleSet,
    ScheduleSpec,
    read_stored_version,
)
from cronkeeper.timing import Trigger

log = logging.getLogger("cronkeeper.scheduler")

MAX_PERIODS_PER_SCHEDULE_TICK = 5_000  # a long outage is worked off over several ticks
# One tick's transaction stays well under the stall timeout even on a loaded machine (10,000
# periods a tick tripped a 2 s --stall-timeout there: tests/test_daemon_resilience.py); a bigger
# burst is decided over consecutive ticks, each committed alone.
MAX_PERIODS_PER_TICK = 5_000
BATCH_ROWS = 1_000  # periods per batch: a chunk of the tick's COPY, or one claim statement
ADOPT_ROWS = 5_000  # schedule versions recorded per transaction
LOAD_ROWS = 1_000  # stored versions read (and parsed) per transaction when a term begins
LOG_EACH_UP_TO = 1_000  # more decisions (or changes) than this: one summary line at info


@dataclass(slots=True)
class ScheduleState:
    spec: ScheduleSpec
    version_id: int
    trigger: Trigger
    after: datetime  # every period up to and including this instant is decided
    family: Family  # what decides its claims besides its name, version and periods
    next_fire: datetime | None = None


class Family(NamedTuple):
    """What a schedule's periods are decided and written with, besides its name, version and
    due periods: schedules of one family with the same due periods share one plan and one set
    of claim groups. Built once per schedule version, one shared tuple per distinct value."""

    misfire: Misfire
    grace: float
    catch_up_limit: float
    overlap: Overlap
    jitter: float
    job: JobColumns


@dataclass(slots=True)
class TickReport:
    now: datetime
    decisions: list[tuple[str, Decision, int | None]] = field(default_factory=list)
    lost: int = 0  # periods another leader had already decided


class Scheduler:
    def __init__(
        self,
        conn: RawConnection,
        *,
        cluster: str,
        term: int,
        lock_key: int,
        on_tick: Callable[[TickReport], None] | None = None,
        on_progress: Callable[[], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        resume_floor: timedelta = timedelta(days=400),
    ) -> None:
        self.conn = conn
        self.cluster = cluster
        self.term = term
        self.lock_key = lock_key
        self.on_tick = on_tick
        # Called as each bounded step of the term's work is done (the stall watchdog's feed):
        # a page of versions read, a batch of versions adopted, a claim batch sent.
        self.on_progress = on_progress
        self.should_stop = should_stop
        self.resume_floor = resume_floor  # periods older than retention are never re-planned
        self.skipped_versions: dict[str, str] = {}  # schedule -> why its stored version is unusable
        self.states: dict[str, ScheduleState] = {}
        # Schedules by next fire: one bucket per instant and a heap of the instants. A burst's
        # 100,000 schedules share an instant, so taking them is a list walk, not 100,000 pops
        # from a heap of (instant, name) pairs that compare equal instants, then names.
        self._due_at: dict[datetime, list[str]] = {}
        self._instants: list[datetime] = []
        self._horizon: datetime | None = None  # the last tick decided every period up to here
        self.behind = False  # the last tick left due periods for the next one (a long outage)
        self._families: dict[Family, Family] = {}  # one tuple per distinct value

    # -- fencing ---------------------------------------------------------------------------
    def confirm(self) -> datetime:
        """Heartbeat; raises LeadershipLost unless we still hold the lock under our term."""
        now = dbl.leadership_confirm(self.conn, self.cluster, self.term, self.lock_key)
        if now is None:
            raise LeadershipLost(f"term {self.term}: the lock or the term is no longer ours")
        return now

    # -- schedule versions -------------------------------------------------------------------
    def load_versions(self) -> None:
        """Plan with the versions in force in the database (those the previous leader used).

        Read ``LOAD_ROWS`` schedules at a time, by name, each page in a transaction of its own
        that begins with ``confirm`` (a heartbeat), and reported as progress once parsed: a
        new term reading back 100,000 versions on a busy machine takes longer than the stall
        bound, which watches each page, not the whole. Only a leader writes versions, and no
        other leader can while this term holds the lock: the pages are one consistent set."""
        self.states = {}
        self.skipped_versions = {}
        cursor = ""  # the last name read: the next page starts after it
        while True:
            with self.conn.transaction():
                now = self.confirm()
                page = versions_in_force(self.conn, cursor, LOAD_ROWS)
                versions = [v for v in page if v.spec is not None]
                last = periods_last(self.conn, [v.schedule for v in versions])
            floor = now - self.resume_floor
            for v in versions:
                try:
                    spec, trigger = stored_spec(v)
                except CronkeeperError as exc:  # one unreadable row must not stop the others
                    self.skipped_versions[v.schedule] = str(exc)
                    log.error("%s; it is not planned until a leader records a readable version",
                              exc, extra={"action": "version_unreadable", "schedule": v.schedule})
                    continue
                after = max(last.get(v.schedule, v.active_from), v.active_from, floor)
                self.states[v.schedule] = ScheduleState(spec, v.id, trigger, after,
                                                        self._family(spec))
            self._progress()
            if len(page) < LOAD_ROWS:
                break
            cursor = page[-1].schedule
        self._rebuild_heap()

    def _progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress()

    def adopt(self, schedules: ScheduleSet) -> dict[str, str]:
        """Make the file set the one in force from now on: new, changed and removed schedules
        get a version row active from the last tick's horizon (the database's now when it
        read the clock). Call right after ``tick``, which decided every period up to that
        horizon under the old versions. Returns {schedule: 'new'|'changed'|'removed'}."""
        wanted = schedules.by_name()
        changes: dict[str, str] = {}
        # In steps of ADOPT_ROWS schedules compared, their changes recorded in a transaction
        # fenced and heartbeating, each step reported as progress: 100,000 new schedules are
        # not one long transaction, nor one step longer than the stall bound on a busy machine
        # (comparing digests alone costs 1 s at 30,000 there), and only one batch's JSON is in
        # memory. A leader lost half-way leaves the batches it committed on their new version
        # and the rest on their old one, each consistent; the next leader reads the committed
        # ones back and adopts only the rest, from its own horizon.
        at: datetime | None = None
        ids: dict[str, int] = {}
        rows: list[tuple[str, ScheduleSpec | None]] = []
        for n, (name, spec) in enumerate(wanted.items(), 1):
            state = self.states.get(name)
            if state is None or state.spec.digest != spec.digest:
                changes[name] = "changed" if state else "new"
                rows.append((name, spec))
            else:  # the same spec: keep one copy (the file's) in memory, not two
                state.spec = spec
            if n % ADOPT_ROWS == 0:
                at, rows = self._record_versions(rows, at, ids), []
        for name in self.states.keys() - wanted.keys():
            changes[name] = "removed"
            rows.append((name, None))
            if len(rows) >= ADOPT_ROWS:
                at, rows = self._record_versions(rows, at, ids), []
        at = self._record_versions(rows, at, ids)
        if not changes:
            return changes
        assert at is not None
        each = len(changes) <= LOG_EACH_UP_TO
        for n, (name, kind) in enumerate(changes.items(), 1):
            if n % ADOPT_ROWS == 0:
                self._progress()  # a pass over the whole set is steps too (1 s at 100,000)
            if kind != "removed":
                version_id = ids.get(name)
                if version_id is None:  # another leader recorded the same instant: reload to agree
                    raise LeadershipLost("a concurrent leader recorded schedule versions")
                spec = wanted[name]
                self.states[name] = ScheduleState(spec, version_id, spec.trigger(), at,
                                                  self._family(spec))
            else:
                del self.states[name]
            if each:
                log.info("schedule %s", kind, extra={
                    "action": f"schedule_{kind}", "schedule": name, "term": self.term})
        if not each:
            counts = Counter(changes.values())
            log.info("schedules adopted: %s", ", ".join(f"{n} {k}" for k, n in sorted(
                counts.items())), extra={"action": "schedules_adopted", "term": self.term})
        self._rebuild_heap()
        return changes

    def _record_versions(self, rows: list[tuple[str, ScheduleSpec | None]],
                         at: datetime | None, ids: dict[str, int]) -> datetime | None:
        """One step of ``adopt``: record ``rows`` (if any) in one fenced transaction, active
        from ``at`` (None: the first batch sets it), their ids into ``ids``; then report
        progress. Returns ``at``."""
        if rows:
            with self.conn.transaction():
                now = self.confirm()
                if at is None:
                    # The old versions decided every period up to the last tick's horizon; the
                    # new ones take over from exactly there: no instant is left to neither.
                    at = min(self._horizon, now) if self._horizon is not None else now
                batch = [_version_row(name, spec) for name, spec in rows]
                ids.update(versions_insert(self.conn, batch, at, self.term))
        self._progress()  # committed: a term that ends now leaves this batch adopted
        return at

    # -- ticking -------------------------------------------------------------------------------
    def _rebuild_heap(self) -> None:
        self._due_at = {}
        self._instants = []
        next_fire = _Memo(lambda trigger, after: trigger.next_fire(after))
        for n, (name, state) in enumerate(self.states.items(), 1):
            if n % ADOPT_ROWS == 0:
                self._progress()  # (see adopt)
            state.next_fire = next_fire(state.trigger, state.after)
            if state.next_fire is not None:
                self._due_at.setdefault(state.next_fire, []).append(name)
        for bucket in self._due_at.values():
            bucket.sort()
        self._instants = list(self._due_at)
        heapq.heapify(self._instants)

    def _push(self, when: datetime, name: str) -> None:
        bucket = self._due_at.get(when)
        if bucket is None:
            bucket = self._due_at[when] = []
            heapq.heappush(self._instants, when)
        bucket.append(name)

    def next_due(self) -> datetime | None:
        return self._instants[0] if self._instants else None

    def tick_until_current(self) -> TickReport:
        """Tick until every period due by the last tick's now is decided: what ``adopt`` needs,
        so that no instant is left to neither the old version nor the new one."""
        report = self.tick()
        while self.behind and not self.should_stop():
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
        fires = _Memo(lambda trigger, after: list(
            itertools.islice(trigger.fires(after, now), MAX_PERIODS_PER_SCHEDULE_TICK)))
        states = self.states
        while self._instants and self._instants[0] <= now:
            if budget <= 0:  # the rest stay in their buckets for the next tick
                self.behind = True
                break
            when = self._instants[0]
            bucket = self._due_at[when]
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
            del bucket[:taken]
            if not bucket:
                heapq.heappop(self._instants)
                del self._due_at[when]
        report = TickReport(now=now)
        horizon = now
        with self.conn.transaction():
            # (_decide advances the due schedules to their next fire as its last batch goes out)
            now, claims = (self.confirm(), []) if not due else self._decide(due)
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
        now = self.confirm()
        paused = controls_paused(self.conn)
        busy = outbox_unfinished(
            self.conn,
            [n for n in due if self.states[n].spec.overlap is Overlap.SKIP and n not in paused],
        )
        return now, periods_claim(self.conn, self._batches(due, now, paused, busy), self.term,
                                  self.on_progress)

    def _batches(
        self, due: dict[str, Sequence[datetime]], now: datetime, paused: set[str], busy: set[str]
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
            is_paused, is_busy = name in paused, name in busy
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
                self._progress()  # a big tick is progress batch by batch, not at its end
                yield batch
                batch = batch.following()
        if len(batch):
            yield batch
        # Every batch is sent; the server is still writing the last ones. Advance the schedules
        # meanwhile: if the tick fails after this, the term ends and its states go with it.
        self._advance(due)

    def _advance(self, due: dict[str, Sequence[datetime]]) -> None:
        """Move each decided schedule past its periods and file it under its next fire."""
        next_fire = _Memo(lambda trigger, after: trigger.next_fire(after))
        states = self.states
        for name, periods in due.items():
            state = states[name]
            state.after = periods[-1]
            state.next_fire = next_fire(state.trigger, state.after)
            if state.next_fire is not None:
                self._push(state.next_fire, name)

    def _family(self, spec: ScheduleSpec) -> Family:
        family = Family(spec.misfire, spec.grace, spec.catch_up_limit, spec.overlap, spec.jitter,
                        job_columns(spec))
        return self._families.setdefault(family, family)


def _jittered(name: str, jitter: float, decision: Decision) -> datetime | None:
    if decision.outcome is not Outcome.EMITTED:
        return None
    at = decision.scheduled_for
    return at + timedelta(seconds=period_jitter(idempotency_key(name, at), jitter))


def job_columns(spec: ScheduleSpec) -> JobColumns:
    """The outbox columns every job of the spec shares (its periods' and a manual trigger's)."""
    return JobColumns(spec.task_name, spec.payload_json, spec.max_attempts, spec.timeout,
                      _backoff_json(spec.backoff), spec.overlap is Overlap.SERIAL, spec.owner)


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


def _version_row(name: str, spec: ScheduleSpec | None) -> tuple[str, str, str | None]:
    """(schedule, digest, spec JSON) of a version row; a removal is ("removed", None)."""
    if spec is None:
        return name, "removed", None
    text, digest = spec.canonical_and_digest()
    return name, digest, text


def stored_spec(version: VersionRow) -> tuple[ScheduleSpec, Trigger]:
    """The spec and trigger of a stored version row (UnreadableVersion if it cannot be read)."""
    return read_stored_version(version.schedule, version.id, version.spec)


_OUTCOMES: dict[str, Outcome] = {o.value: o for o in Outcome}
_REASONS: dict[str | None, Reason | None] = {None: None, **{r.value: r for r in Reason}}


class _Memo:
    """``compute(trigger, after)`` remembered for one pass (a tick, a heap rebuild): schedules
    that share a trigger instance (``make_trigger`` shares them) and a horizon get one answer.
    Keyed by the trigger's identity: the states hold every trigger for the whole pass."""

    __slots__ = ("compute", "seen")

    def __init__(self, compute: Callable[[Trigger, datetime], Any]) -> None:
        self.compute = compute
        self.seen: dict[tuple[int, datetime], Any] = {}

    def __call__(self, trigger: Trigger, after: datetime) -> Any:
        key = (id(trigger), after)
        try:
            return self.seen[key]
        except KeyError:
            value = self.seen[key] = self.compute(trigger, after)
            return value


@functools.lru_cache(maxsize=256)
def _backoff_json(backoff: Backoff) -> str:
    return json.dumps({"base": backoff.base, "factor": backoff.factor, "max": backoff.max})

