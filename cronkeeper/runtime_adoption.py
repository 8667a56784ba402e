"""The leader's side of runtime schedules (``cronkeeper.schedules``; docs/runtime-schedules.md):
looking at what the applications committed, and making it the version in force.

    look    what changed: at a term's first look every row's head (by name, a page per
            transaction), then only rows whose writer had not ended at the previous look
            (``runtime_heads(since=xmin)``; a transaction that commits late is read then);
            the specs of those that differ from the version in force
    record  after a tick (the caller's), versions recorded in fenced transactions:
            new/changed  active from the tick's horizon, under the id the put gave out: the
                         tick decided every period up to there by the old version, and the
                         horizon is past the commit, so a put never causes a catch-up fire
            removed      active from just after its last decided period: periods the claim's
                         fence held back (``scheduler``) are nobody's, never "missing"
            recreated    (deleted, then put again) removed, then new

A name a file schedule holds is left to the file (logged: ``daemon.runtime_conflicts`` keeps
such a set from being loaded, and a put of it is refused; only a race lets both through).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cronkeeper.db.calendars import calendars_record
from cronkeeper.db.runtime_schedules import (
    RuntimeHead,
    runtime_fence,
    runtime_heads,
    runtime_specs,
    runtime_xmin,
)
from cronkeeper.db.schedule_versions import versions_insert
from cronkeeper.errors import CronkeeperError, LeadershipLost
from cronkeeper.schedule.model import ScheduleSet, read_stored_version
from cronkeeper.term import Term
from cronkeeper.versions import (
    ADOPT_ROWS,
    LOAD_ROWS,
    LOG_EACH_UP_TO,
    RUNTIME_ORIGIN,
    ScheduleState,
    VersionsInForce,
    file_origin_of,
)

log = logging.getLogger("cronkeeper.runtime")
TICK = timedelta(microseconds=1)


@dataclass(frozen=True, slots=True)
class Change:
    """One runtime schedule to adopt: ``kind`` new, changed, removed or recreated; ``spec``
    (canonical JSON) and ``digest`` for all but a removal."""

    head: RuntimeHead
    kind: str
    spec: dict[str, Any] | None = None
    digest: str | None = None


class RuntimeAdopter:
    """One per term (``scheduler.Scheduler``), over the term's versions in force."""

    def __init__(self, in_force: VersionsInForce) -> None:
        self.in_force = in_force
        self.term = in_force.term
        self.since: int | None = None  # the poll's cursor (a snapshot xmin); None: look at all
        self._pending_since: int | None = None
        self._conflicts: set[str] = set()  # names already said to be held by a file

    def look(self) -> list[Change]:
        """What changed since the last look (see the module's docstring): heads only, the
        specs are read batch by batch as they are recorded (``record``)."""
        conn = self.term.conn
        xmin = runtime_xmin(conn)
        if self.since is None:
            heads: list[RuntimeHead] = []
            after = ""
            while True:
                page = runtime_heads(conn, after=after, limit=LOAD_ROWS)
                heads.extend(page)
                self.term.progress()
                if len(page) < LOAD_ROWS:
                    break
                after = page[-1].name
        else:
            heads = runtime_heads(conn, since=self.since)
        changes = self._classify(heads)
        if self.since is None:  # a runtime schedule in force whose row is gone: removed too
            seen = {h.name for h in heads}
            changes += [Change(RuntimeHead(n, st.version_id, st.incarnation or 0, True), "removed")
                        for n, st in self.in_force.states.items()
                        if st.incarnation is not None and n not in seen]
        self._pending_since = xmin
        if not changes:
            self.since = xmin
        return changes

    def _classify(self, heads: list[RuntimeHead]) -> list[Change]:
        states = self.in_force.states
        changes = []
        for head in heads:
            state = states.get(head.name)
            if state is not None and state.incarnation is None:  # a file schedule's name
                if not head.deleted and head.name not in self._conflicts:
                    self._conflicts.add(head.name)
                    log.error("runtime schedule %s is not adopted: a file schedule holds the "
                              "name (%s)", head.name, state.spec.file,
                              extra={"action": "schedule_conflict", "schedule": head.name})
                continue
            if head.deleted:
                if state is not None or head.name in self.in_force.unreadable:
                    changes.append(Change(head, "removed"))
                continue
            kind = self._kind(head)
            if kind is None and state is not None:
                state.incarnation = head.incarnation  # the version in force: now known whose
            elif kind is not None:
                changes.append(Change(head, kind))
        return changes

    def _kind(self, head: RuntimeHead) -> str | None:
        state = self.in_force.states.get(head.name)
        if state is None:  # (a version recorded but unreadable here is known: said, not planned)
            return None if self.in_force.unreadable.get(head.name) == head.version_id else "new"
        if state.version_id == head.version_id:
            return None
        # a later incarnation than the version in force: deleted and put again
        return "recreated" if head.incarnation > state.version_id else "changed"

    def record(self, changes: list[Change], horizon: datetime | None) -> dict[str, str]:
        """Make ``changes`` the versions in force (call right after a tick: ``horizon`` is its
        now), ADOPT_ROWS at a time: their specs read, their versions recorded in a fenced
        transaction, each batch a step of progress. Returns {schedule: kind}."""
        done: dict[str, str] = {}
        for i in range(0, len(changes), ADOPT_ROWS):
            self._record_batch(changes[i:i + ADOPT_ROWS], horizon, done)
            self.term.progress()  # committed: a term that ends now leaves this batch adopted
        if self._pending_since is not None:
            self.since = self._pending_since
        self._say(done)
        return done

    def _record_batch(self, batch: list[Change], horizon: datetime | None,
                      done: dict[str, str]) -> None:
        states = self.in_force.states
        conn = self.term.conn
        specs = runtime_specs(conn, [c.head.name for c in batch if c.kind != "removed"])
        changes = []
        for c in batch:
            if c.kind == "removed":
                changes.append(c)
            elif c.head.name in specs:  # (deleted since the look: the next look removes it)
                head, spec, digest = specs[c.head.name]
                kind = self._kind(head)
                if kind is not None:
                    changes.append(Change(head, kind, spec, digest))
        with conn.transaction():
            now = self.term.confirm()
            at = min(horizon, now) if horizon is not None else now
            unreadable = self.in_force.unreadable  # (never planned: removed from ``at``)
            gone = [(c.head.name, states[c.head.name].after + TICK if c.head.name in states
                     else None) for c in changes if c.kind in ("removed", "recreated")
                    and (c.head.name in states or c.head.name in unreadable)]
            versions_insert(conn, [(name, "removed", None) for name, _ in gone], at,
                            self.term.number, origins=[RUNTIME_ORIGIN] * len(gone),
                            starts=[start for _, start in gone])
            put = [c for c in changes if c.kind != "removed"]
            recorded = versions_insert(
                conn, [(c.head.name, c.digest or "", c.spec) for c in put], at, self.term.number,
                origins=[RUNTIME_ORIGIN] * len(put), ids=[c.head.version_id for c in put],
                starts=[max(at, states[c.head.name].after + 2 * TICK)
                        if c.head.name in states else at for c in put])
            for c in changes:
                self._apply(c, at, recorded, done)

    def _apply(self, c: Change, at: datetime, recorded: dict[str, int],
               done: dict[str, str]) -> None:
        states = self.in_force.states
        name = c.head.name
        if c.kind == "removed":
            states.pop(name, None)
            self.in_force.unreadable.pop(name, None)
            done[name] = "removed"
            return
        if recorded.get(name) != c.head.version_id:
            raise LeadershipLost("a concurrent leader recorded schedule versions")
        old = states.get(name)
        try:
            spec, trigger = read_stored_version(name, c.head.version_id, c.spec)
        except CronkeeperError as exc:  # recorded as put (it was validated); not planned
            states.pop(name, None)
            self.in_force.unreadable[name] = c.head.version_id  # known from now on (``_kind``)
            log.error("%s; it is not planned", exc,
                      extra={"action": "version_unreadable", "schedule": name})
            return
        self.in_force.unreadable.pop(name, None)
        after = at if old is None or c.kind == "recreated" else max(at, old.after)
        if c.kind == "recreated" and old is not None:
            after = max(at, old.after + 2 * TICK)
        states[name] = ScheduleState(spec, c.head.version_id, trigger, after,
                                     self.in_force.family(spec), trigger.next_fire(after),
                                     c.head.incarnation)
        done[name] = c.kind

    def _say(self, done: dict[str, str]) -> None:
        if len(done) <= LOG_EACH_UP_TO:
            for name, kind in done.items():
                log.info("runtime schedule %s", kind, extra={
                    "action": f"schedule_{kind}", "schedule": name, "source": "runtime",
                    "term": self.term.number})
        elif done:
            log.info("runtime schedules adopted: %d", len(done), extra={
                "action": "schedules_adopted", "source": "runtime", "term": self.term.number})


def record_calendars(term: Term, schedules: ScheduleSet) -> None:
    """Record the calendars the file set defines, for runtime specs to name (the files are on
    this host, not in the database): after each adoption of a file set, one fenced statement;
    an unchanged set writes nothing."""
    rows = [(c.name, c.iso_dates(), file_origin_of(path)) for c, path in schedules.calendars]
    with term.conn.transaction():
        term.confirm()
        written, removed = calendars_record(term.conn, rows, term.number)
    term.progress()
    if written or removed:
        log.info("calendars recorded for runtime schedules: %d written, %d removed", written,
                 removed, extra={"action": "calendars_recorded", "term": term.number})


def held_back(conn: Any, states: Mapping[str, ScheduleState],
              due: Mapping[str, Sequence[datetime]]) -> list[str]:
    """The claim's fence (migration 0015; docs/runtime-schedules.md), in the tick's transaction:
    lock the rows of the due runtime schedules FOR KEY SHARE, and return those to decide
    nothing for now: deleted, being deleted, or put again after a delete (another incarnation
    than the one in force). File schedules cost nothing: no statement unless one is due."""
    runtime = [n for n in due if states[n].incarnation is not None]
    if not runtime:
        return []
    live = runtime_fence(conn, runtime)
    held = []
    for name in runtime:
        state = states[name]
        got = live.get(name)
        known = state.incarnation if state.incarnation is not None else -1
        # known < 0: read back from a version; a later incarnation was created after it
        if got is None or (got != known if known >= 0 else got > state.version_id):
            held.append(name)
    return held
