"""--compare: the old system's fires beside cronkeeper's, per converted entry, every difference
marked, DST days always shown (docs/import.md).

Old fires come from :mod:`cronie` (a simulation of cronie's daemon loop) for a crontab and from
Celery's own ``is_due`` (driven by a simulated beat clock) for a beat schedule; cronkeeper's come
from its trigger. Both are multisets of instants: cronie may run one job twice in one minute.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from cronkeeper.importing.model import Entry
from cronkeeper.timing import make_trigger, parse_duration

HEAD = 3  # fires shown from the start of the window
MAX_DIFFERENCES_SHOWN = 40
DST_WINDOW = 2 * 3600  # fires this close to an offset change are shown (those that differ: all)
DST_ROWS = 8


@dataclass(frozen=True, slots=True)
class Side:
    entry: Entry
    old: list[int]  # Unix seconds, ascending, may repeat
    new: list[int]
    daemon_zone: str | None = None  # cronie's own zone, when the job has its own (CRON_TZ)
    until: datetime | None = None  # set when the old side was simulated over a shorter span

    @property
    def differences(self) -> list[int]:
        a, b = Counter(self.old), Counter(self.new)
        return sorted(set((a - b).elements()) | set((b - a).elements()))


def cronkeeper_fires(entry: Entry, start: datetime, end: datetime) -> list[int]:
    every = entry.get("every")
    trigger = make_trigger(
        cron=entry.get("cron"),
        every=parse_duration(every) if every is not None else None,
        timezone=entry.get("timezone"),
    )
    return [int(t.timestamp()) for t in trigger.fires(start, end)]


def transitions(zone_name: str, start: datetime, end: datetime) -> list[tuple[int, str, str]]:
    """(instant, abbreviation before, after) of each offset change in the window."""
    zone = ZoneInfo(zone_name)
    out = []
    t, stop = int(start.timestamp()) // 3600 * 3600, int(end.timestamp())

    def off(x: int) -> tuple[timedelta | None, str | None]:
        d = datetime.fromtimestamp(x, zone)
        return d.utcoffset(), d.tzname()

    prev = off(t)
    while t < stop:
        nxt = off(t + 3600)
        if nxt[0] != prev[0]:
            m = next(x for x in range(t, t + 3601, 60) if off(x)[0] != prev[0])
            out.append((m, prev[1] or "", nxt[1] or ""))
        prev = nxt
        t += 3600
    return out


def _local(t: int, zone: ZoneInfo) -> str:
    return datetime.fromtimestamp(t, zone).isoformat()


def _rows(side: Side, zone: ZoneInfo, instants: Sequence[int]) -> Iterator[str]:
    a, b = Counter(side.old), Counter(side.new)
    for t in instants:
        for k in range(max(a[t], b[t])):
            old = _local(t, zone) if k < a[t] else "-"
            new = _local(t, zone) if k < b[t] else "-"
            mark = "!" if old != new else " "
            yield f" {mark} {old:27}  {new}"


def render(sides: Sequence[Side], old_label: str, days: int, start: datetime) -> str:
    lines: list[str] = []
    end = start + timedelta(days=days)
    total_diff = 0
    for side in sides:
        entry = side.entry
        zone_name = entry.get("timezone")
        zone = ZoneInfo(zone_name)
        when = f'cron "{entry.get("cron")}"' if entry.get("cron") else f'every "{entry.get("every")}"'
        lines.append(f"== {entry.name}: {when} in {zone_name} ({entry.where})")
        lines.append(f"   {old_label:27}  cronkeeper")
        union = sorted(set(side.old) | set(side.new))
        shown: set[int] = set()
        head = union[:HEAD]
        lines.extend(_rows(side, zone, head))
        shown.update(head)
        changes = [(i, b, a, zone_name, zone_name) for i, b, a in transitions(zone_name, start, end)]
        if side.daemon_zone and side.daemon_zone != zone_name:
            changes += [(i, b, a, side.daemon_zone, f"{side.daemon_zone}, cronie's zone")
                        for i, b, a in transitions(side.daemon_zone, start, end)]
        for instant, before, after, changing, where in sorted(changes):
            near = sorted((t for t in union if abs(t - instant) <= DST_WINDOW),
                          key=lambda t: (abs(t - instant), t))[:DST_ROWS]
            day = sorted(set(near) | {t for t in side.differences if abs(t - instant) <= DST_WINDOW})
            label = datetime.fromtimestamp(instant, ZoneInfo(changing)).date().isoformat()
            lines.append(f"   DST {label} in {where} ({before} -> {after}):"
                         + ("" if day else " no fire within 2 hours of the change"))
            lines.extend(_rows(side, zone, day))  # shown even when the head had them
            shown.update(day)
        differing = [t for t in side.differences if t not in shown]
        if differing:
            lines.append("   other differences:")
            lines.extend(_rows(side, zone, differing[:MAX_DIFFERENCES_SHOWN]))
            if len(differing) > MAX_DIFFERENCES_SHOWN:
                lines.append(f"   ... and {len(differing) - MAX_DIFFERENCES_SHOWN} more")
        n = len(side.differences)
        total_diff += n
        if side.until is not None:
            lines.append(f"   (compared up to {side.until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} "
                         "only: a schedule this frequent is simulated for fewer days)")
        lines.append(
            f"   {len(side.old)} {old_label} fires, {len(side.new)} cronkeeper fires in {days} "
            f"days; {n} instant{'s differ' if n != 1 else ' differs'}" + (" (marked !)" if n else "")
        )
        lines.append("")
    lines.append(
        f"{len(sides)} entr{'ies' if len(sides) != 1 else 'y'} compared from "
        f"{start.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} for {days} days; "
        f"{total_diff} differing instant{'s' if total_diff != 1 else ''}"
    )
    return "\n".join(lines)


def crontab_sides(
    entries: Sequence[Entry], daemon_zone: str, start: datetime, days: int
) -> list[Side]:
    from cronkeeper.importing.cronie import simulate

    end = start + timedelta(days=days)
    jobs = [(e.old.cron, e.old.timezone if e.old.job_tz else None) for e in entries]
    old = simulate(jobs, daemon_zone, start, end)
    return [
        Side(e, o, cronkeeper_fires(e, start, end), daemon_zone if e.old.job_tz else None)
        for e, o in zip(entries, old, strict=True)
    ]


def celery_sides(
    entries: Sequence[Entry], start: datetime, days: int,
    fires: Callable[[object, str, datetime, datetime], tuple[list[int], datetime]],
) -> list[Side]:  # fmt: skip
    """``fires(schedule, zone, start, end)`` runs beat's own code in the entry's ``timezone``,
    the zone the schedule was written in."""
    end = start + timedelta(days=days)
    sides = []
    for e in entries:
        old, reached = fires(e.old, e.get("timezone"), start, end)
        sides.append(Side(e, old, cronkeeper_fires(e, start, reached),
                          until=reached if reached < end else None))  # fmt: skip
    return sides
