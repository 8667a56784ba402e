"""Each schedule's figures as ``status`` shows them (its owner, next fire, grace, run-time
figures, and the periods missing in the last hour), from the leader's summary where it may be
used, computed live otherwise (docs/observability.md, "Where status's figures come from").

A summary row (``db.schedule_summaries``, written by ``cronkeeper.summarizer``) is used only
while a leader leads, when it is at most ``STALE_AFTER`` seconds old and when it was computed
under the version still in force; its next fire only when the schedule's latest decided period
is still the one it was computed after (else that next fire is computed here, from the version's
trigger). Every other schedule (no row, an old or stale one, no leader, or ``use_summary``
False) is computed live, as the summarizer computes it: ``audit.audit_schedule`` over the last
hour, ``db.attempts.attempts_runtimes``, ``trigger.next_fire``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from typing import TYPE_CHECKING, Any

from cronkeeper.db.periods import periods_windows
from cronkeeper.db.schedule_summaries import SummaryRow, summaries_read
from cronkeeper.db.schedule_versions import versions_all
from cronkeeper.runtimes import Runtime, runtime_of
from cronkeeper.summary import (
    AUDIT_WINDOW,
    STALE_AFTER,
    missing_at,
    next_after,
    next_fire_after,
    period_around,
    usable,
)

if TYPE_CHECKING:
    from cronkeeper.audit import Version

AUDIT_CHUNK = 1_000  # schedules whose last hour of periods one statement reads


@dataclass(frozen=True, slots=True)
class Figures:
    """One schedule in force, as status shows it. ``period``: the length of its period around
    the reader's now when the summary knows it (``periods_of`` computes the others)."""

    owner: str | None
    next_fire: datetime | None
    grace: float
    runtime: Runtime
    period: float | None = None
    period_known: bool = False


@dataclass(slots=True)
class Gathered:
    """Every schedule in force's figures, the missing counts (schedules with some), problems
    (versions that cannot be read), and where the figures came from."""

    figures: dict[str, Figures] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    summarized: int = 0
    oldest: SummaryRow | None = None  # the oldest summary row used

    def source(self) -> dict[str, Any]:
        """``status``'s ``figures`` object: how many schedules' figures came from the leader's
        summary, how many were computed live, and how old the oldest summary row used is."""
        return {
            "summarized": self.summarized,
            "computed_live": len(self.figures) - self.summarized,
            "oldest_computed_at": None if self.oldest is None else self.oldest.computed_at,
            "oldest_age_seconds": (None if self.oldest is None
                                   else round(max(self.oldest.age_seconds, 0.0), 3)),
            "stale_after_seconds": STALE_AFTER,
        }


def heads_in_force(heads: Iterable[tuple[int, str, bool, datetime]]
                   ) -> dict[str, tuple[int, datetime]]:
    """``versions_heads`` rows -> {schedule in force: (version id, active_from)}."""
    return {name: (vid, active_from) for vid, name, removed, active_from in heads if not removed}


def parsed(rows: list) -> tuple[dict[str, list[Version]], list[str]]:
    """Version rows ordered by schedule -> versions by schedule; a schedule with a row that
    cannot be read is left out, the reason listed (that schedule only)."""
    from cronkeeper.audit import versions_from_rows

    out: dict[str, list[Version]] = {}
    problems = []
    for _name, group in groupby(rows, key=lambda row: row[1]):
        try:
            out.update(versions_from_rows(list(group)))
        except ValueError as exc:
            problems.append(str(exc))
    return out, problems


def gather_figures(conn: Any, now: datetime, heads: list,
                   read_latest: Callable[[], dict[str, tuple]], *, summaries: bool,
                   read_runtimes: Callable[[list[str]], Future]) -> Gathered:
    """The figures of every schedule in force. ``read_latest()``: each schedule's latest
    decided period (``db.periods.periods_latest``, read meanwhile); ``summaries``: the leader's
    summary may be used (a leader leads); ``read_runtimes(names)`` reads run-time figures (on
    a connection of its own: the heaviest statement runs while this one reads the rest)."""
    current = heads_in_force(heads)
    rows: dict[str, SummaryRow] = {}
    if summaries:
        rows = usable(summaries_read(conn), {n: v for n, (v, _) in current.items()})
    live = sorted(current.keys() - rows.keys())
    reading = read_runtimes(live) if live else None
    since = now - AUDIT_WINDOW
    # audited live: the schedules without a usable row, those removed within the hour, and
    # those whose row cannot count its missing periods at this now (more left the hour)
    removed = [name for _, name, gone, active_from in heads if gone and active_from >= since]
    counted = {n: missing_at(r, now) for n, r in rows.items()}
    recount = [n for n, (known, _) in counted.items() if not known]
    audit_too = live + removed + recount
    versions, problems = parsed(versions_all(conn, audit_too)) if audit_too else ({}, [])
    out = Gathered(problems=problems, summarized=len(rows))
    if versions:
        out.missing.update(_audit_live(conn, versions, since, now))
    # summary rows whose next fire moved on since (a period decided after it was computed)
    latest = read_latest()
    afters = {n: next_after(active_from, _at(latest.get(n)))
              for n, (_, active_from) in current.items()}
    nexts = {n: next_fire_after(r, afters[n]) for n, r in rows.items()}
    refire = [n for n, (known, _) in nexts.items() if not known]
    heads_of = {name: vs[-1] for name, vs in versions.items()}
    if refire:
        more, problems = parsed(versions_all(conn, refire))
        out.problems += problems
        heads_of.update((name, vs[-1]) for name, vs in more.items())
    figures_of = reading.result() if reading is not None else {}
    for name in sorted(current):
        row = rows.get(name)
        head = heads_of.get(name)
        after = afters[name]
        if row is not None:
            known, count = counted[name]
            if known and count:
                out.missing[name] = count
            known, upcoming = nexts[name]
            if known:
                pass
            elif head is not None and head.spec is not None:
                upcoming = head.spec.trigger().next_fire(after)
            else:
                continue  # its version cannot be read now (listed in problems)
            found = (row.duration_attempts, row.duration_p50_seconds, row.duration_p99_seconds,
                     row.attempts_timed_out_24h)
            known, period = period_around(row, now)
            out.figures[name] = Figures(row.owner, upcoming, row.grace_seconds,
                                        runtime_of(name, row.timeout_seconds, found),
                                        period, known)
            if out.oldest is None or row.computed_at < out.oldest.computed_at:
                out.oldest = row
        elif head is not None and head.spec is not None:
            spec = head.spec
            out.figures[name] = Figures(spec.owner, spec.trigger().next_fire(after), spec.grace,
                                        runtime_of(name, spec.timeout, figures_of.get(name)))
    return out


def _audit_live(conn: Any, versions: dict[str, list[Version]], since: datetime,
                now: datetime) -> dict[str, int]:
    """The missing periods of the last hour of the schedules computed live (``history``'s
    audit), AUDIT_CHUNK schedules' periods per statement. Imported only when there are some: a
    status that reads the whole summary never loads the audit, the specs or the calendars."""
    from cronkeeper.audit import audit_schedule, in_window, records_from_rows

    missing = {}
    audited = [name for name, vs in versions.items() if in_window(vs, since, now)]
    for i in range(0, len(audited), AUDIT_CHUNK):  # one statement per chunk, not per schedule
        rows_of = periods_windows(conn, [(n, since) for n in audited[i:i + AUDIT_CHUNK]], now)
        for name, records in rows_of.items():
            _, summary = audit_schedule(name, versions[name], records_from_rows(records),
                                        since=since, until=now, now=now)
            if summary.missing:
                missing[name] = summary.missing
    return missing


def periods_of(conn: Any, names: Iterable[str], now: datetime, figures: dict[str, Figures]
               ) -> dict[str, float | None]:
    """The length of each named schedule's period around ``now`` (the diagnosis of a queue
    behind compares its oldest ready job's wait with it): from the summary where it knows it,
    else from its version in force, parsed."""
    wanted = {n for n in names if n in figures}
    out = {n: figures[n].period for n in wanted if figures[n].period_known}
    if wanted - out.keys():
        from cronkeeper.audit import period_seconds

        versions, _ = parsed(versions_all(conn, sorted(wanted - out.keys())))
        out.update((name, period_seconds(vs[-1].spec, now)) for name, vs in versions.items()
                   if vs[-1].spec is not None)
    return out


def _at(latest: tuple | None) -> datetime | None:
    return None if latest is None else latest[0]
