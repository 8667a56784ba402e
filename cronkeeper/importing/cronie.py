"""cronie's daemon loop, simulated minute by minute, to show what cron itself would run (--compare).

Written from cronie's ``cron.c`` (main loop) and ``find_jobs``, independently of cronkeeper's
trigger code (only the field sets come from ``parse_cron``): the daemon keeps a *virtual* clock
of local minutes and wakes each minute of real time. When local time advanced by exactly one
minute it runs every job matching the new minute. Otherwise, by how far the wall clock jumped:

- 1 to 5 minutes forward (woke late): every job for each minute skipped;
- 6 minutes to 3 hours forward (DST starts): "wildcard" jobs (minute or hour field starting
  with ``*``) for the current minute only; fixed-time jobs for each skipped minute, at once;
- backward up to 3 hours (DST ends): wildcard jobs for the current minute; fixed-time jobs wait
  until the virtual clock catches up, so they do not repeat;
- more than 3 hours: jump, and run every job for the current minute.

Jobs under ``CRON_TZ`` (here also ``TZ``, docs/import.md) are matched against the wall time of the
same instant in their own zone, while the stepping above follows the daemon's zone: cronie's own
comment says such jobs may be missed or run twice around DST changes in the job's zone. A fire is
recorded at the real minute the daemon runs it. Pure: instants in, instants out.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

from cronkeeper.timing import parse_cron

_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


class _Offsets:
    """UTC offset (seconds) of a zone per minute, computed once per hour (every tz change
    falls on a whole minute, and no zone changes twice within an hour)."""

    def __init__(self, zone: ZoneInfo) -> None:
        self.zone = zone
        self.hour = -1
        self.flat: int | None = None
        self.per_minute: list[int] = []

    def _at(self, t: int) -> int:
        off = datetime.fromtimestamp(t, self.zone).utcoffset()
        assert off is not None
        return int(off.total_seconds())

    def __call__(self, t: int) -> int:
        hour = t // 3600
        if hour != self.hour:
            self.hour = hour
            a, b = self._at(hour * 3600), self._at(hour * 3600 + 3599)
            self.flat = a if a == b else None
            if self.flat is None:
                self.per_minute = [self._at(hour * 3600 + 60 * m) for m in range(60)]
        if self.flat is not None:
            return self.flat
        return self.per_minute[(t % 3600) // 60]


class _Job:
    __slots__ = ("minutes", "hours", "days", "months", "weekdays", "day_and", "wild", "offsets")

    def __init__(self, cron: str, job_zone: str | None) -> None:
        e = parse_cron(cron)
        self.minutes, self.hours = frozenset(e.minutes), frozenset(e.hours)
        self.days, self.months = frozenset(e.days), frozenset(e.months)
        self.weekdays = frozenset(e.weekdays)
        text = cron.split() if not cron.startswith("@") else None
        if text is None:  # a macro: cronie expands @hourly to "0 * ..." with no star flags...
            # ...except that cronie sets MIN_STAR|HR_STAR for @hourly ("0 * * * *" in its table)
            self.wild = cron == "@hourly"
            self.day_and = True
        else:
            self.wild = text[0].startswith("*") or text[1].startswith("*")
            self.day_and = text[2].startswith("*") or text[4].startswith("*")
        self.offsets = _Offsets(ZoneInfo(job_zone)) if job_zone else None

    def matches(self, minute: int, hour: int, day: int, month: int, weekday: int) -> bool:
        if minute not in self.minutes or hour not in self.hours or month not in self.months:
            return False
        dom, dow = day in self.days, weekday in self.weekdays
        return (dom and dow) if self.day_and else (dom or dow)


def _fields(local_minute: int) -> tuple[int, int, int, int, int]:
    day, rest = divmod(local_minute, 1440)
    d = date.fromordinal(_EPOCH_ORDINAL + day)
    return rest % 60, rest // 60, d.day, d.month, d.isoweekday() % 7


def simulate(
    jobs: Sequence[tuple[str, str | None]], daemon_zone: str, start: datetime, end: datetime
) -> list[list[int]]:
    """Fire instants (Unix seconds, ``start < t <= end``) of each ``(cron, job zone or None)``
    under a cronie daemon running in ``daemon_zone``, started at ``start``."""
    zone_offsets = _Offsets(ZoneInfo(daemon_zone))
    table = [_Job(cron, job_zone) for cron, job_zone in jobs]
    fires: list[list[int]] = [[] for _ in table]
    t = int(start.astimezone(UTC).timestamp()) // 60 * 60
    stop = int(end.astimezone(UTC).timestamp())
    virtual = (t + zone_offsets(t)) // 60

    def find(vminute: int, offset: int, wild: bool, fixed: bool, now: int) -> None:
        local = _fields(vminute)
        instant = vminute * 60 - offset
        for i, job in enumerate(table):
            if not ((wild and job.wild) or (fixed and not job.wild)):
                continue
            fields = local
            if job.offsets is not None:
                fields = _fields((instant + job.offsets(instant)) // 60)
            if job.matches(*fields):  # cronie runs its queue between virtual minutes, so a
                fires[i].append(now)  # job two skipped minutes name runs twice, at once

    t += 60
    while t <= stop:
        offset = zone_offsets(t)
        running = (t + offset) // 60
        diff = running - virtual
        if diff == 1:
            virtual = running
            find(virtual, offset, True, True, t)
        elif diff > 180 or diff < -180:
            virtual = running
            find(running, offset, True, True, t)
        elif diff > 5:
            find(running, offset, True, False, t)
            while virtual < running:
                virtual += 1
                find(virtual, offset, False, True, t)
        elif diff > 0:
            while virtual < running:
                virtual += 1
                find(virtual, offset, True, True, t)
        else:
            find(running, offset, True, False, t)
        t += 60
    return fires
