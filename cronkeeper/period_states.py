"""The audit reduced to each period's state, for readers that need only states (the web's
state filters at 10,000 schedules): the same rows as ``audit.audit_schedule``, in the same
order, each as (Unix second, letter), without formatting a ``HistoryRow``. Pure.

Letters: E emitted, S skipped, D emitted and its job dead, R emitted and its job running,
P pending, M missing (``state_letter`` gives the letter of a ``HistoryRow``). As in the audit,
an expected fire without a record on a date its version's calendar lists is S."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from cronkeeper.audit import (
    FireSource,
    HistoryRow,
    Status,
    Version,
    uncached_fires,
    unix,
    version_spans,
)
from cronkeeper.planning import listed_test

JOB_LETTER = {"dead": "D", "running": "R"}


def state_letter(row: HistoryRow) -> str:
    if row[2] == Status.EMITTED.value:
        return JOB_LETTER.get(row[6] or "", "E")
    return {"skipped": "S", "pending": "P", "missing": "M"}[row[2]]


class Expected(NamedTuple):
    """One schedule's expected fires for a states-only audit, computed before its records are
    read: which instants the last N rows can hold, and from where a record can matter. (A
    NamedTuple: a state filter builds 10,000 of them a request, and a frozen dataclass's
    ``__init__`` costs three times as much.)"""

    fires: list[int]  # ascending Unix seconds; only the last N when N was given
    edges: dict[int, float]  # fire -> its version's grace edge, when versions differ
    edge: float  # the grace edge when one version judges every fire
    last_expected: int | None  # the latest expected fire in the whole window
    lo: int
    hi: int
    last: int | None
    start: datetime  # records before this instant cannot be among the last N rows
    listed: frozenset[int] = frozenset()  # fires on dates their version's calendar lists


def expected_tail(
    versions: Sequence[Version],
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    triggers: dict | None = None,
    fires: FireSource | None = None,
    last: int | None = None,
) -> Expected:
    """The expected side of ``audit_states``. With ``last``, only the last N fires are kept:
    the rows are the sorted union of fires and records, so its last N are all at or after the
    N-th last fire, and a record before that instant (``start``) can never be among them; a
    reader may leave such records unread."""
    until = min(until, now)
    now_s = now.timestamp()
    source = fires or uncached_fires
    parts = [(source(version.version_id, trigger, after, upto),
              now_s - version.spec.grace)  # type: ignore[union-attr]
             for version, trigger, after, upto in version_spans(versions, since, until,
                                                                 triggers)]
    listed: set[int] = set()
    tests = [listed_test(v.spec) for v in versions if v.spec is not None]
    if any(tests):  # a calendar: which fires fall on its dates, version by version
        parts = [(list(fired), edge) for fired, edge in parts]
        for (fired, _), (version, *_) in zip(parts, version_spans(versions, since, until,
                                                                  triggers), strict=True):
            test = listed_test(version.spec)  # type: ignore[arg-type]
            if test is not None:
                listed.update(t for t in fired if test(t))
    edges: dict[int, float] = {}
    edge = 0.0
    if len(parts) == 1:
        fired, edge = parts[0]
        expected = fired if isinstance(fired, list) else list(fired)  # the cache's is a copy
    else:  # each version's fires are judged by its own grace
        for fired, its_edge in parts:
            edges.update(dict.fromkeys(fired, its_edge))
        expected = sorted(edges)
    last_expected = expected[-1] if expected else None
    start = since
    if last and len(expected) > last:
        expected = expected[-last:]
        start = max(since, datetime.fromtimestamp(expected[0], UTC))
    return Expected(expected, edges, edge, last_expected, unix(since), unix(until), last, start,
                    frozenset(listed))


def _rows(expected: Expected, got: Mapping[int, str]) -> list[int]:
    """The instants of the rows: the sorted union of the expected fires and the records that
    count (before the last expected fire, or inside the window), the last N when N was given."""
    fires, last = expected.fires, expected.last
    if last == 0:
        return []
    floor = fires[0] if last and len(fires) >= last else None
    last_expected, lo, hi = expected.last_expected, expected.lo, expected.hi
    known = set(fires)
    extra = [at for at in got if at not in known
             and (floor is None or at >= floor)
             and ((last_expected is not None and at <= last_expected) or lo <= at <= hi)]
    if not extra:  # the usual case: every record is an expected fire
        return fires
    rows = sorted(known.union(extra))
    return rows[-last:] if last is not None else rows


def judge(expected: Expected, records: Mapping[int, str] | Iterable[tuple[int, str]]
          ) -> list[tuple[int, str]]:
    """The rows (instant, state letter) of ``expected`` and its schedule's records (instant ->
    letter, E S D R, in any order): a recorded row has its record's letter, an expected fire
    without one is P (pending) from its version's grace edge on, else M (missing)."""
    got = records if isinstance(records, dict) else dict(records)
    rows = _rows(expected, got)
    edges, edge, get, listed = expected.edges, expected.edge, got.get, expected.listed
    if listed:
        return [(at, get(at) or ("S" if at in listed else
                                 "P" if at >= edges.get(at, edge) else "M")) for at in rows]
    if edges:
        return [(at, get(at) or ("P" if at >= edges.get(at, edge) else "M")) for at in rows]
    return [(at, get(at) or ("P" if at >= edge else "M")) for at in rows]


def holds(expected: Expected, records: Mapping[int, str], letter: str) -> bool:
    """Whether any row of ``judge(expected, records)`` has ``letter``, answered with set and
    map operations instead of a row at a time (a state filter asks it of every schedule)."""
    rows = _rows(expected, records)
    if letter not in "MP" and not (letter == "S" and expected.listed):  # a recorded state
        return letter in map(records.get, rows)
    if expected.edges or expected.listed:  # several graces, or a calendar: row by row
        return any(code == letter for _, code in judge(expected, records))
    cut = bisect_left(rows, expected.edge)  # rows before the edge are past their grace
    side = rows[:cut] if letter == "M" else rows[cut:]
    return not all(map(records.__contains__, side))


def audit_states(
    versions: Sequence[Version],
    records: Mapping[int, str] | Iterable[tuple[int, str]],
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    triggers: dict | None = None,
    fires: FireSource | None = None,
    last: int | None = None,
) -> list[tuple[int, str]]:
    """``audit_schedule`` reduced to (instant, state letter) per row, same rows in the same
    order (the ``last`` ones only, when given), without formatting a row. Records are
    instant -> letter (E S D R), in any order. The rows are the sorted union of
    the expected fires and the records; an expected fire without a record is pending or
    missing by its version's grace. Tests hold it to ``audit_schedule`` row for row."""
    return judge(expected_tail(versions, since=since, until=until, now=now, triggers=triggers,
                               fires=fires, last=last), records)
