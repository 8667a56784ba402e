"""The leader's audit for ``missing`` notifications (docs/notifications.md): every ``EVERY``
seconds, the periods of the last 24 hours of each schedule in force, judged by ``history``'s
rules (``cronkeeper.audit``); a period due beyond its grace with no recorded outcome that was
not told yet is noted (``notifications_note_missing``), in the transaction of the step that
found it.

The leader's loop calls ``step`` between ticks: each step audits ``CHUNK`` schedules in one
transaction on the lock session, begun with ``Term.confirm`` (fenced) and reported as progress,
so a pass over many schedules never holds a fire long. A pass after the first of a term looks
back only to where the previous one had judged each schedule for good (its instant less the
schedule's grace); the first looks back 24 hours, and periods told already (``missing_through``
of ``notification_subjects``) are not told again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from cronkeeper import clock
from cronkeeper.audit import (
    Status,
    audit_schedule,
    in_window,
    records_from_rows,
    versions_from_rows,
)
from cronkeeper.db.notification_subjects import subjects_missing_through
from cronkeeper.db.notifications import Skipped, notifications_note_missing
from cronkeeper.db.periods import periods_windows
from cronkeeper.db.schedule_versions import versions_all
from cronkeeper.errors import UnreadableVersion

log = logging.getLogger("cronkeeper.notify")

EVERY = 240.0  # seconds from the start of one pass to the next (the spec: at least every 5 min)
LOOKBACK = timedelta(hours=24)
CHUNK = 100  # schedules audited in one step


class MissingWatch:
    def __init__(self) -> None:
        self._queue: list[str] = []
        self._next = 0.0
        self._judged: dict[str, datetime] = {}  # schedule -> judged for good up to here

    def step(self, term: Any, names: Iterable[str]) -> None:
        """One step of the pass (starting one when it is time)."""
        if not self._queue:
            if clock.monotonic() < self._next:
                return
            self._next = clock.monotonic() + EVERY
            self._queue = sorted(names)
        batch, self._queue = self._queue[:CHUNK], self._queue[CHUNK:]
        if not batch:
            return
        with term.conn.transaction():
            now = term.confirm()
            found = self._audit(term.conn, batch, now)
            if found:
                notifications_note_missing(term.conn, found)
        term.progress()
        for row in found:
            log.warning("periods missing: %s: %d from %s to %s (told)", row.schedule, row.count,
                        row.first.isoformat(), row.last.isoformat(),
                        extra={"action": "periods_missing_noted", "schedule": row.schedule,
                               "term": term.number})

    def _audit(self, conn: Any, batch: list[str], now: datetime) -> list[Skipped]:
        told = subjects_missing_through(conn, batch)
        versions: dict[str, list] = {}
        for version_row in _by_schedule(versions_all(conn, batch)):
            try:
                versions.update(versions_from_rows(version_row))
            except (UnreadableVersion, ValueError):
                continue  # that schedule only: the metrics and status say why
        floor = now - LOOKBACK
        since = {name: max(floor, self._judged.get(name, floor), told.get(name, floor))
                 for name, vs in versions.items() if in_window(vs, floor, now)}
        rows_of = periods_windows(conn, list(since.items()), now)
        found = []
        for name, start in since.items():
            vs = versions[name]
            rows, summary = audit_schedule(name, vs, records_from_rows(rows_of[name]),
                                           since=start, until=now, now=now)
            spec = next((v.spec for v in reversed(vs) if v.spec is not None), None)
            grace = spec.grace if spec is not None else 0.0
            self._judged[name] = max(start, now - timedelta(seconds=grace + 1))
            missing = [_instant(r.scheduled_for) for r in rows if r.status == Status.MISSING]
            missing = [at for at in missing if name not in told or at > told[name]]
            if missing:
                found.append(Skipped(name, spec.task_name if spec else None, summary.owner,
                                     len(missing), min(missing), max(missing)))
        return found


def _by_schedule(rows: list) -> Iterable[list]:
    """Version rows (ordered by schedule), one schedule's at a time."""
    from itertools import groupby

    for _name, group in groupby(rows, key=lambda row: row[1]):
        yield list(group)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
