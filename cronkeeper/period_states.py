"""The audit reduced to each period's state, for readers that need only states (the web's
state filters at 10,000 schedules): the same rows as ``audit.audit_schedule``, in the same
order, each as (Unix second, letter), without formatting a ``HistoryRow``. Pure.

Letters: E emitted, S skipped, D emitted and its job dead, R emitted and its job running,
P pending, M missing (``state_letter`` gives the letter of a ``HistoryRow``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from cronkeeper.audit import (
    FireSource,
    HistoryRow,
    Status,
    Version,
    uncached_fires,
    unix,
    version_spans,
)

JOB_LETTER = {"dead": "D", "running": "R"}


def state_letter(row: HistoryRow) -> str:
    if row[2] == Status.EMITTED.value:
        return JOB_LETTER.get(row[6] or "", "E")
    return {"skipped": "S", "pending": "P", "missing": "M"}[row[2]]


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
    until = min(until, now)
    now_s = now.timestamp()
    lo, hi = unix(since), unix(until)
    got = records if isinstance(records, dict) else dict(records)
    source = fires or uncached_fires
    parts = [(source(version.version_id, trigger, after, upto),
              now_s - version.spec.grace)  # type: ignore[union-attr]
             for version, trigger, after, upto in version_spans(versions, since, until,
                                                                 triggers)]
    edges: dict[int, float] = {}
    edge = 0.0
    if len(parts) == 1:
        union, edge = set(parts[0][0]), parts[0][1]
    else:  # each version's fires are judged by its own grace
        for fired, its_edge in parts:
            edges.update(dict.fromkeys(fired, its_edge))
        union = set(edges)
    last_expected = max(union) if union else None
    for at in got:  # a record after the last fire counts only inside the window (as audited)
        if (last_expected is not None and at <= last_expected) or lo <= at <= hi:
            union.add(at)
    rows = sorted(union)
    if last is not None:
        rows = rows[-last:] if last else []
    out = []
    for at in rows:
        code = got.get(at)
        if code is None:
            code = "P" if at >= edges.get(at, edge) else "M"
        out.append((at, code))
    return out
