"""What is in force: the version of each schedule the leader plans with.

A term begins by reading back the versions in force (those the previous leader recorded,
``VersionsInForce.load``); a file set is made the one in force by recording a version row for
each new, changed and removed schedule (``adopt``), active from the last tick's horizon. Every
read and write is a transaction of its own on the term's lock session, begun with
``Term.confirm``, and each is a bounded step reported as progress (``election``'s docstring).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from cronkeeper.db.periods import periods_last
from cronkeeper.db.periods_claims import JobColumns
from cronkeeper.db.schedule_versions import VersionRow, versions_in_force, versions_insert
from cronkeeper.errors import CronkeeperError, LeadershipLost
from cronkeeper.schedule.model import (
    Backoff,
    Misfire,
    Overlap,
    ScheduleSet,
    ScheduleSpec,
    read_stored_version,
)
from cronkeeper.term import Term
from cronkeeper.timing import Trigger
from cronkeeper.timing.calendars import Calendar

log = logging.getLogger("cronkeeper.versions")

ADOPT_ROWS = 5_000  # schedule versions recorded per transaction (and a pass's progress step)
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
    # A runtime schedule's incarnation (``runtime_adoption``; the claim's fence compares it);
    # -1: a runtime schedule whose incarnation the term has not read yet; None: a file's.
    incarnation: int | None = None


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
    # (calendar, zone) of a schedule with a calendar (the planner skips the periods on its
    # listed local dates), else None: families without one stay shared across zones.
    calendar: tuple[Calendar, str] | None = None


class VersionsInForce:
    """The schedules a term plans with, by name (``states``), and the stored versions it could
    not read (``unreadable``: schedule -> the version's id)."""

    def __init__(self, term: Term, resume_floor: timedelta = timedelta(days=400)) -> None:
        self.term = term
        self.resume_floor = resume_floor  # periods older than retention are never re-planned
        self.states: dict[str, ScheduleState] = {}
        # schedule -> the id of its version in force that cannot be read (a runtime spec checked
        # against a newer tz database than this host's, a row edited by hand): recorded, not
        # planned; ``runtime_adoption`` takes it as known, not as another leader's
        self.unreadable: dict[str, int] = {}
        self._families: dict[Family, Family] = {}  # one tuple per distinct value

    def load(self) -> None:
        """Plan with the versions in force in the database (those the previous leader used).

        Read ``LOAD_ROWS`` schedules at a time, by name, each page in a transaction of its own
        that begins with ``confirm`` (a heartbeat), and reported as progress once parsed: a
        new term reading back 100,000 versions on a busy machine takes longer than the stall
        bound, which watches each page, not the whole. Only a leader writes versions, and no
        other leader can while this term holds the lock: the pages are one consistent set."""
        self.states = {}
        self.unreadable = {}
        conn = self.term.conn
        cursor = ""  # the last name read: the next page starts after it
        while True:
            with conn.transaction():
                now = self.term.confirm()
                page = versions_in_force(conn, cursor, LOAD_ROWS)
                versions = [v for v in page if v.spec is not None]
                last = periods_last(conn, [v.schedule for v in versions])
            floor = now - self.resume_floor
            for v in versions:
                try:
                    spec, trigger = stored_spec(v)
                except CronkeeperError as exc:  # one unreadable row must not stop the others
                    self.unreadable[v.schedule] = v.id
                    log.error("%s; it is not planned until a leader records a readable version",
                              exc, extra={"action": "version_unreadable", "schedule": v.schedule})
                    continue
                after = max(last.get(v.schedule, v.active_from), v.active_from, floor)
                self.states[v.schedule] = ScheduleState(
                    spec, v.id, trigger, after, self.family(spec),
                    incarnation=-1 if v.origin == RUNTIME_ORIGIN else None)
            self.term.progress()
            if len(page) < LOAD_ROWS:
                break
            cursor = page[-1].schedule

    def adopt(self, schedules: ScheduleSet, horizon: datetime | None) -> dict[str, str]:
        """Make the file set the one in force from ``horizon`` (the last tick's: the database's
        now when it read the clock) on: new, changed and removed schedules get a version row
        active from there. Call right after a tick, which decided every period up to that
        horizon under the old versions. Returns {schedule: 'new'|'changed'|'removed'}."""
        wanted = schedules.by_name()
        held = [n for n, state in self.states.items()
                if state.incarnation is not None and n in wanted]
        for name in held:  # a put won the name first (daemon.runtime_conflicts refuses the set)
            log.error("schedule %s: the file schedule (%s) is not adopted: the name is held by "
                      "a runtime schedule (cronkeeper.schedules)", name, wanted[name].file,
                      extra={"action": "schedule_conflict", "schedule": name})
            del wanted[name]
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
                at, rows = self._record(rows, at, horizon, ids), []
        for name in [n for n, state in self.states.items()
                     if state.incarnation is None and n not in wanted]:
            changes[name] = "removed"
            rows.append((name, None))
            if len(rows) >= ADOPT_ROWS:
                at, rows = self._record(rows, at, horizon, ids), []
        at = self._record(rows, at, horizon, ids)
        if not changes:
            return changes
        assert at is not None
        each = len(changes) <= LOG_EACH_UP_TO
        for n, (name, kind) in enumerate(changes.items(), 1):
            if n % ADOPT_ROWS == 0:
                self.term.progress()  # a pass over the whole set is steps too (1 s at 100,000)
            if kind != "removed":
                version_id = ids.get(name)
                if version_id is None:  # another leader recorded the same instant: reload to agree
                    raise LeadershipLost("a concurrent leader recorded schedule versions")
                spec = wanted[name]
                self.states[name] = ScheduleState(spec, version_id, spec.trigger(), at,
                                                  self.family(spec))
            else:
                del self.states[name]
            if each:
                log.info("schedule %s", kind, extra={
                    "action": f"schedule_{kind}", "schedule": name, "term": self.term.number})
        if not each:
            counts = Counter(changes.values())
            log.info("schedules adopted: %s", ", ".join(f"{n} {k}" for k, n in sorted(
                counts.items())), extra={"action": "schedules_adopted", "term": self.term.number})
        return changes

    def _record(self, rows: list[tuple[str, ScheduleSpec | None]], at: datetime | None,
                horizon: datetime | None, ids: dict[str, int]) -> datetime | None:
        """One step of ``adopt``: record ``rows`` (if any) in one fenced transaction, active
        from ``at`` (None: the first batch sets it), their ids into ``ids``; then report
        progress. Returns ``at``."""
        if rows:
            with self.term.conn.transaction():
                now = self.term.confirm()
                if at is None:
                    # The old versions decided every period up to the last tick's horizon; the
                    # new ones take over from exactly there: no instant is left to neither.
                    at = min(horizon, now) if horizon is not None else now
                batch = [_version_row(name, spec) for name, spec in rows]
                origins = [file_origin(spec) for _, spec in rows]
                ids.update(versions_insert(self.term.conn, batch, at, self.term.number,
                                           origins=origins))
        self.term.progress()  # committed: a term that ends now leaves this batch adopted
        return at

    def family(self, spec: ScheduleSpec) -> Family:
        """The shared Family tuple of ``spec``."""
        calendar = (spec.calendar, spec.timezone) if spec.calendar is not None else None
        family = Family(spec.misfire, spec.grace, spec.catch_up_limit, spec.overlap, spec.jitter,
                        job_columns(spec), calendar)
        return self._families.setdefault(family, family)


RUNTIME_ORIGIN = "runtime"  # schedule_versions.origin of a runtime schedule's versions


def file_origin(spec: ScheduleSpec | None) -> str | None:
    """schedule_versions.origin of a file schedule's version: its file (what a runtime put of
    the name is told); None for a removal."""
    return None if spec is None else file_origin_of(spec.file)


def file_origin_of(path: str) -> str:
    """'file:<absolute path>' (or 'file:' when the path is unknown)."""
    return "file:" + os.path.abspath(path) if path else "file:"


def job_columns(spec: ScheduleSpec) -> JobColumns:
    """The outbox columns every job of the spec shares (its periods' and a manual trigger's)."""
    return JobColumns(spec.task_name, spec.payload_json, spec.max_attempts, spec.timeout,
                      _backoff_json(spec.backoff), spec.overlap is Overlap.SERIAL, spec.owner)


@functools.lru_cache(maxsize=256)
def _backoff_json(backoff: Backoff) -> str:
    return json.dumps({"base": backoff.base, "factor": backoff.factor, "max": backoff.max})


def _version_row(name: str, spec: ScheduleSpec | None) -> tuple[str, str, str | None]:
    """(schedule, digest, spec JSON) of a version row; a removal is ("removed", None)."""
    if spec is None:
        return name, "removed", None
    text, digest = spec.canonical_and_digest()
    return name, digest, text


def stored_spec(version: VersionRow) -> tuple[ScheduleSpec, Trigger]:
    """The spec and trigger of a stored version row (UnreadableVersion if it cannot be read)."""
    return read_stored_version(version.schedule, version.id, version.spec)
