"""The leader's summarizer: one audit and one run-time read per schedule, kept in
``schedule_summaries`` for ``status``, the web and the metrics, and told as ``missing``
notifications and ``period_missing`` log lines (docs/observability.md, "Where status's figures
come from").

The leader's loop (``leading.LeaderLoop``) calls ``step`` between ticks. A pass over the
schedules in force starts every ``EVERY`` seconds (from the start of one to the next, or at once
when a pass takes longer); each step takes ``CHUNK`` schedules in one transaction on the lock
session, begun with ``Term.confirm`` (fenced by the term) and reported as progress (the stall
watchdog's feed), so a pass over 10,000 schedules never holds a fire long. For each schedule of
the step, in that transaction:

- its versions (parsed once per version id; the leader's spec when it is the one in force) and
  its recorded periods from the earlier of an hour ago and where the notification's audit
  resumes (``notify.missing.MissingWatch``: 24 hours back on a term's first pass, then from
  where the previous pass judged it for good), judged by ``audit.audit_schedule``: the one
  audit whose rows give the missing count of the last hour (``missing_in``), the ``missing``
  notification and the ``period_missing`` log line of each newly missing period;
- its next undecided fire after its latest decided period (the leader's own when its state
  is at that period: no calendar work), as ``status`` computes it (``next_after``);
- its run-time figures (``db.attempts.attempts_runtimes``, the statement ``status`` runs).

Readers judge each row: they use it while a leader leads, the row is younger than their bound
(``STALE_AFTER``) and its version is still in force, and compute that schedule live otherwise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from itertools import groupby
from typing import Any

from cronkeeper import clock
from cronkeeper.audit import (
    HistoryRow,
    Status,
    Version,
    audit_schedule,
    in_window,
    iso_second,
    records_from_rows,
)
from cronkeeper.db.attempts import attempts_runtimes
from cronkeeper.db.notification_subjects import subjects_missing_through
from cronkeeper.db.notifications import Skipped, notifications_note_missing
from cronkeeper.db.periods import periods_latest, periods_windows
from cronkeeper.db.schedule_summaries import SummaryRow, summaries_write
from cronkeeper.db.schedule_versions import versions_all
from cronkeeper.db.sessions import session_jit_off
from cronkeeper.notify.missing import MissingWatch
from cronkeeper.runtimes import SAMPLE
from cronkeeper.schedule.model import read_stored_version
from cronkeeper.summary import (
    AUDIT_WINDOW,
    EVERY,
    FIRES_AHEAD,
    FIRES_MAX,
    MISSING_KEPT,
    next_after,
)

log = logging.getLogger("cronkeeper.summarizer")

CHUNK = 250  # schedules summarized in one step (one transaction)
LOGGED_KEEP = 100_000  # newly missing periods remembered (logged once), then forgotten


def missing_in(rows: Iterable[HistoryRow], since: datetime) -> tuple[int, list[datetime]]:
    """Periods the audit found missing at or after ``since`` (periods are whole seconds): how
    many, and the earliest ``MISSING_KEPT`` of them."""
    first = iso_second(math.ceil(since.timestamp()))
    missing = Status.MISSING.value
    found = [r.scheduled_for for r in rows if r.status == missing and r.scheduled_for >= first]
    return len(found), [datetime.fromisoformat(at.replace("Z", "+00:00"))
                        for at in found[:MISSING_KEPT]]


class Summarizer:
    """One per term. ``notify``: also tell missing periods (a notify config is loaded)."""

    def __init__(self, *, notify: bool = False) -> None:
        self.watch = MissingWatch() if notify else None
        self._queue: list[str] = []
        self._next = 0.0
        self._parsed: dict[int, Version] = {}  # version id -> parsed (versions never change)
        self._logged: set[tuple[str, str]] = set()
        # schedule -> (version id, the decided period its list follows, its next fires)
        self._lists: dict[str, tuple[int, datetime, list[datetime]]] = {}
        self.passes = 0  # passes completed (tests wait on it)

    def step(self, term: Any, names: Collection[str], states: Mapping[str, Any] | None = None
             ) -> bool:
        """One step of the pass (starting one when it is time); ``states``: the leader's
        ``ScheduleState`` by name (their specs and next fires save parsing and calendar work).
        Returns whether a batch was summarized."""
        if not self._queue:
            if clock.monotonic() < self._next:
                return False
            self._next = clock.monotonic() + EVERY
            self._queue = sorted(names)
        batch, self._queue = self._queue[:CHUNK], self._queue[CHUNK:]
        found: list[Skipped] = []
        newly: list[tuple[str, str | None, str]] = []
        with term.conn.transaction():
            now = term.confirm()
            session_jit_off(term.conn)
            rows, found, newly = self._summarize(term.conn, batch, now, term.number, states or {})
            summaries_write(term.conn, rows)
            if found:
                notifications_note_missing(term.conn, found)
        term.progress()
        if not self._queue:
            self.passes += 1
        for name, owner, at in newly:
            log.warning("period missing: %s due at %s has no recorded outcome", name, at,
                        extra={"action": "period_missing", "schedule": name,
                               "scheduled_for": at, "owner": owner, "term": term.number})
        for row in found:
            log.warning("periods missing: %s: %d from %s to %s (told)", row.schedule, row.count,
                        row.first.isoformat(), row.last.isoformat(),
                        extra={"action": "periods_missing_noted", "schedule": row.schedule,
                               "term": term.number})
        return True

    def _summarize(self, conn: Any, batch: list[str], now: datetime, term: int,
                   states: Mapping[str, Any]
                   ) -> tuple[list[SummaryRow], list[Skipped], list[tuple[str, str | None, str]]]:
        versions = self._versions(conn, batch, states)
        figures = attempts_runtimes(conn, list(versions), SAMPLE)
        latest = periods_latest(conn, list(versions))
        since = now - AUDIT_WINDOW
        told = subjects_missing_through(conn, list(versions)) if self.watch else {}
        starts = {name: (min(since, self.watch.since(name, now, told)) if self.watch else since)
                  for name in versions}
        audited = {n: s for n, s in starts.items() if in_window(versions[n], s, now)}
        records = periods_windows(conn, list(audited.items()), now)
        out, found, newly = [], [], []
        for name, vs in versions.items():
            head = vs[-1]
            spec = head.spec
            if spec is None:
                continue  # removed: nothing in force to summarize
            missing: tuple[int, list[datetime]] = (0, [])
            if name in audited:
                rows, _ = audit_schedule(name, vs, records_from_rows(records[name]),
                                         since=audited[name], until=now, now=now)
                if in_window(vs, since, now):
                    missing = missing_in(rows, since)
                newly += self._newly_missing(name, spec.owner, rows, since)
                if self.watch is not None:
                    told_one = self.watch.judge(name, vs, rows, audited[name], now, told)
                    if told_one is not None:
                        found.append(told_one)
            last = latest.get(name)
            after = next_after(head.active_from, last[0] if last else None)
            state = states.get(name)
            if state is None or state.version_id != head.version_id:
                state = None
            trigger = state.trigger if state is not None else spec.trigger()
            upcoming = self._fires(name, head.version_id, trigger, state, after, now)
            n, p50, p99, timed_out = figures.get(name, (0, None, None, 0))
            out.append(SummaryRow(name, head.version_id, spec.owner, spec.timeout, spec.grace,
                                  after, upcoming, *missing, n, p50, p99,
                                  timed_out, term, now))
        return out, found, newly

    def _fires(self, name: str, version_id: int, trigger: Any, state: Any, after: datetime,
               now: datetime) -> list[datetime]:
        """Every fire after ``after`` (the schedule's latest decided period) up to
        ``FIRES_AHEAD`` past ``now``, and the two after that (at most ``FIRES_MAX`` in all):
        readers find in it the next undecided fire after periods decided since
        (``summary.next_fire_after``) and the period around their now
        (``summary.period_around``) for as long as they use the row. The previous pass's list
        is kept and extended (it is complete from its own ``after``, which is not later), so a
        pass does calendar work only for the fires that came due since."""
        known = self._lists.get(name)
        if known is not None and known[0] == version_id and known[1] <= after:
            fires = [f for f in known[2] if f > after]
        else:
            if state is not None and state.after == after and state.next_fire is not None:
                first = state.next_fire  # the leader's own: no calendar work for the first
            else:
                first = trigger.next_fire(after)
            fires = [] if first is None else [first]
        horizon = now + FIRES_AHEAD
        while fires and len(fires) < FIRES_MAX and sum(f > horizon for f in fires[-2:]) < 2:
            following = trigger.next_fire(fires[-1])
            if following is None:
                break
            fires.append(following)
        self._lists[name] = (version_id, after, fires)
        return list(fires)

    def _versions(self, conn: Any, batch: list[str], states: Mapping[str, Any]
                  ) -> dict[str, list[Version]]:
        """Each schedule's versions, oldest first; a schedule with a version that cannot be
        read is left out (``status`` and the metrics say why, computing it live)."""
        out: dict[str, list[Version]] = {}
        for name, group in groupby(versions_all(conn, batch), key=lambda row: row[1]):
            try:
                out[name] = [self._version(row, states.get(name)) for row in group]
            except ValueError:
                continue
        return out

    def _version(self, row: tuple, state: Any) -> Version:
        version_id, name, data, active_from = row
        known = self._parsed.get(version_id)
        if known is not None:
            return known
        if data is None:
            version = Version(name, version_id, None, active_from)
        elif state is not None and state.version_id == version_id:
            version = Version(name, version_id, state.spec, active_from)
        else:
            spec, _ = read_stored_version(name, version_id, data)
            version = Version(name, version_id, spec, active_from)
        self._parsed[version_id] = version
        return version

    def _newly_missing(self, name: str, owner: str | None, rows: list[HistoryRow],
                       since: datetime) -> list[tuple[str, str | None, str]]:
        """Missing periods of the last hour not logged before (each is logged once per term;
        the notification's audit may reach further back, the log does not)."""
        out = []
        logged = self._logged
        if len(logged) > LOGGED_KEEP:
            logged.clear()
        first = iso_second(math.ceil(since.timestamp()))
        for row in rows:
            if row.status == Status.MISSING.value and row.scheduled_for >= first \
                    and (name, row.scheduled_for) not in logged:
                logged.add((name, row.scheduled_for))
                out.append((name, owner, row.scheduled_for))
        return out

