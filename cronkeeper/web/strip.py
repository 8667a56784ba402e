"""The period strip: a schedule's last N periods as cells, each with its state, local time and
reason, and the places where the schedule's version changed. Pure: the audit's rows (the same
rows as ``cronkeeper history``) in, cells out; the SVG is drawn by ``web.svg``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from zoneinfo import ZoneInfo

from cronkeeper.audit import FireSource, HistoryRow, Version, audit_schedule

DEFAULT_PERIODS = 48
MAX_PERIODS = 500


class CellState(StrEnum):
    """How a period ended, as the strip shows it (``data-state``)."""

    EMITTED = "emitted"
    SKIPPED = "skipped"
    MISSING = "missing"
    DEAD = "dead"  # emitted, and its job ended dead
    RUNNING = "running"  # emitted, and its job is running now
    PENDING = "pending"  # due within grace, not decided yet


LETTER = {CellState.EMITTED: "E", CellState.SKIPPED: "S", CellState.MISSING: "M",
          CellState.DEAD: "D", CellState.RUNNING: "R", CellState.PENDING: "P"}


@dataclass(frozen=True, slots=True)
class Cell:
    scheduled_for: str  # ISO UTC, as in history
    state: CellState
    reason: str | None
    job_state: str | None
    attempts: int | None
    local: str  # the nominal instant in the schedule's zone, with its offset
    title: str  # the tooltip: local time, UTC, what happened and why


@dataclass(frozen=True, slots=True)
class VersionMark:
    before: int  # index of the first cell judged by the new version
    version_id: int
    active_from: datetime


@dataclass(frozen=True, slots=True)
class Strip:
    schedule: str
    cells: tuple[Cell, ...]
    marks: tuple[VersionMark, ...]

    def count(self, state: CellState) -> int:
        return sum(1 for c in self.cells if c.state is state)

    def counts(self) -> dict[str, int]:
        """Every state's count, in ``CellState`` order (one pass over the cells)."""
        seen = Counter(c.state for c in self.cells)
        return {s.value: seen[s] for s in CellState}

    def label(self) -> str:
        """The strip in words (``aria-label``): every state's count, then the changes."""
        parts = [f"{n} {state}" for state, n in self.counts().items() if n]
        text = f"last {len(self.cells)} periods of {self.schedule}: " + (", ".join(parts) or "none")
        if self.marks:
            text += f"; schedule changed {len(self.marks)} time{'s' if len(self.marks) > 1 else ''}"
        return text


def window_start(versions: Sequence[Version], now: datetime, periods: int,
                 retention_days: float, triggers: dict | None = None,
                 lengths: dict | None = None) -> datetime:
    """Where to start auditing so the window holds the last ``periods`` periods of the spec in
    force (a margin for irregular crons), never before the retention horizon. ``triggers``
    caches trigger objects by version id, as ``audit_schedule`` does; ``lengths`` caches the
    period length by version id with the next fire it was measured at, valid until then (the
    next fire after any instant before it is that same fire)."""
    last = versions[-1]
    current = last.spec
    horizon = now - timedelta(days=retention_days)
    if current is None:
        return horizon
    trigger = None
    if triggers is not None:
        trigger = triggers.get(last.version_id)
        if trigger is None:
            trigger = triggers[last.version_id] = current.trigger()
    known = lengths.get(last.version_id) if lengths is not None else None
    if known is not None and known[0] is not None and now < known[0]:
        length = known[1]
    else:
        trig = trigger or current.trigger()
        following = trig.next_fire(now)  # as ``audit.period_seconds``, keeping the first fire
        second = trig.next_fire(following) if following else None
        length = (second - following).total_seconds() if second and following else 86400.0
        if lengths is not None:
            lengths[last.version_id] = (following, length)
    try:
        start = now - timedelta(seconds=length * (periods + 2) * 1.25)
    except OverflowError:
        return horizon
    return max(start, horizon, versions[0].active_from - timedelta(seconds=1))


def state_of(row: HistoryRow) -> CellState:
    if row.status == "emitted":
        return _JOB_STATE.get(row.job_state or "", CellState.EMITTED)
    return _STATUS[row.status]


_JOB_STATE = {"dead": CellState.DEAD, "running": CellState.RUNNING}
_STATUS = {s.value: s for s in CellState}
_VALUE = {s: s.value for s in CellState}  # ``.value`` is a slow property; a dict is not


@lru_cache(maxsize=1 << 16)
def _local(scheduled_for: str, zone: ZoneInfo) -> tuple[str, str]:
    """(tooltip text, ISO text) of a UTC instant in a zone: the same few thousand instants
    recur across schedules of one zone and across requests, and formatting them was a
    sixth of a 10,000-row page."""
    local = datetime.fromisoformat(scheduled_for.replace("Z", "+00:00")).astimezone(zone)
    return local.strftime("%Y-%m-%d %H:%M:%S %Z (UTC%z)"), local.isoformat()


# What a cell's tooltip says after its state, by state (a skipped one also names its reason).
_AFTER = {CellState.MISSING: " (no outcome recorded: the scheduler never decided this period)",
          CellState.PENDING: " (due within grace, not decided yet)"}


def cell_of(row: HistoryRow, zone: ZoneInfo) -> Cell:
    state, reason = state_of(row), row.reason
    local_text, local_iso = _local(row.scheduled_for, zone)
    title = f"{local_text}, {row.scheduled_for}: {_VALUE[state]}"
    if state is CellState.SKIPPED:
        title += f" (reason: {reason or 'unknown'})"
    elif state in _AFTER:
        title += _AFTER[state]
    if row.job_state:
        title += f"; job {row.job_state}"
        if row.attempts is not None:
            title += f" after {row.attempts} attempt{'s' if row.attempts != 1 else ''}"
    if row.lag_seconds is not None:
        title += f"; lag {row.lag_seconds:g}s"
    return Cell(row.scheduled_for, state, reason, row.job_state, row.attempts, local_iso, title)


def strip_rows(schedule: str, versions: Sequence[Version], records: Sequence[tuple], *,
               since: datetime, now: datetime, until: datetime | None = None,
               periods: int = DEFAULT_PERIODS, triggers: dict | None = None,
               fires: FireSource | None = None) -> list[HistoryRow]:
    """The audit's rows of the last ``periods`` periods up to ``until`` (default: now)."""
    rows, _ = audit_schedule(schedule, versions, records, since=since, until=until or now,
                             now=now, triggers=triggers, fires=fires)
    return rows[-periods:] if periods else []


def build_strip(schedule: str, versions: Sequence[Version], records: Sequence[tuple], *,
                since: datetime, now: datetime, until: datetime | None = None,
                periods: int = DEFAULT_PERIODS, triggers: dict | None = None,
                fires: FireSource | None = None) -> Strip:
    """The last ``periods`` periods up to ``until`` (default: now), judged by the audit."""
    rows = strip_rows(schedule, versions, records, since=since, now=now, until=until,
                      periods=periods, triggers=triggers, fires=fires)
    return strip_from_rows(schedule, versions, rows)


def strip_from_rows(schedule: str, versions: Sequence[Version],
                    rows: Sequence[HistoryRow]) -> Strip:
    current = next((v.spec for v in reversed(versions) if v.spec is not None), None)
    zone = ZoneInfo(current.timezone if current else "UTC")
    cells = tuple(cell_of(r, zone) for r in rows)
    marks = []
    if cells and len(versions) > 1:
        instants = [datetime.fromisoformat(c.scheduled_for.replace("Z", "+00:00")) for c in cells]
        for version in versions[1:]:
            first = next((i for i, t in enumerate(instants) if t > version.active_from), None)
            if first:  # between two shown cells (a change before the first one is not drawn)
                marks.append(VersionMark(first, version.version_id, version.active_from))
    return Strip(schedule, cells, tuple(marks))


def relative(delta_seconds: float) -> str:
    """``in 3 min`` / ``5 h ago``: how far an instant is from now, in words."""
    ahead = delta_seconds >= 0
    s = abs(delta_seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            text = f"{s / size:.0f} {unit}"
            break
    else:
        text = f"{s:.0f} s"
    return f"in {text}" if ahead else f"{text} ago"


def utc(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
