"""The ``schedule_pauses`` table: each span a schedule was paused, ``[paused_at, resumed_at)``
(migrations/0016_schedule_pauses.sql). ``pause`` and ``resume`` write it beside
``schedule_controls`` (``operations.control.set_paused``); the leader reads the spans that can
matter to the periods it decides (``pauses_spans``) and judges each period by them
(``planning.plan``), so a pause is judged at each period's due instant, not at the tick."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import psycopg

from cronkeeper.db.engine import driver, one_row
from cronkeeper.db.sessions import db_now

if TYPE_CHECKING:  # annotations only
    import sqlalchemy as sa

# (start, end): start None is since ever, end None is not resumed (planning.PauseSpan)
Span = tuple[datetime | None, datetime | None]


def pauses_begin(conn: sa.Connection | psycopg.Connection, schedule: str, *,
                 was_paused: bool, changed_at: datetime | None) -> datetime:
    """Open a span for ``schedule`` at the database's clock, now, unless one is open; return
    that instant. Call with the schedule's controls row locked (``controls_lock``), which says
    how it stood (``was_paused``, ``changed_at``): a span left open by an older release's
    resume (controls not paused) is closed first, at that resume's ``changed_at``; a schedule
    an older release paused (controls paused, no span open) is paused since ever, as that
    release judges it, and its span says so (``-infinity``)."""
    cur = driver(conn)
    if not was_paused and changed_at is not None:
        _close(cur, schedule, changed_at)
    at = db_now(cur)
    # (a schedule paused with no span open was paused by an older release: since ever)
    cur.execute(
        "INSERT INTO schedule_pauses (schedule, paused_at)"
        " VALUES (%(s)s, CASE WHEN %(ever)s THEN '-infinity'::timestamptz ELSE %(at)s END)"
        " ON CONFLICT (schedule) WHERE resumed_at IS NULL DO NOTHING",
        {"s": schedule, "at": at, "ever": was_paused})
    return at


def pauses_end(conn: sa.Connection | psycopg.Connection, schedule: str, *,
               was_paused: bool, changed_at: datetime | None) -> datetime:
    """Close ``schedule``'s open span at the database's clock, now; return that instant. Call
    with its controls row locked (``controls_lock``). A span an older release's resume left
    open (controls not paused) is closed at that resume's ``changed_at``; a pause an older
    release wrote (controls paused, no span) is recorded as a span since ever (``-infinity``),
    as that release judged it."""
    cur = driver(conn)
    at = db_now(cur)
    closed = _close(cur, schedule, at if was_paused or changed_at is None else changed_at)
    if not closed and was_paused:
        cur.execute(
            "INSERT INTO schedule_pauses (schedule, paused_at, resumed_at)"
            " VALUES (%(s)s, '-infinity', %(at)s) ON CONFLICT DO NOTHING",
            {"s": schedule, "at": at})
    return at


def _close(cur: psycopg.Connection, schedule: str, at: datetime) -> int:
    """End ``schedule``'s open span at ``at`` (never before it began); how many were open."""
    return cur.execute(
        "UPDATE schedule_pauses SET resumed_at = greatest(%(at)s, paused_at)"
        " WHERE schedule = %(s)s AND resumed_at IS NULL",
        {"s": schedule, "at": at}).rowcount


def pauses_spans(conn: sa.Connection | psycopg.Connection,
                 since: datetime) -> dict[str, tuple[Span, ...]]:
    """The pause spans that can hold a period at or after ``since`` (the oldest period the
    leader is deciding), per schedule, oldest first: the open ones and those resumed after
    ``since`` (both through an index: nothing to read for a cluster that pauses nothing). Rows
    older releases wrote count too: a schedule whose controls say paused with no open span is
    paused since ever; a span still open whose controls say resumed (an older release resumed
    it) ended at the controls' ``changed_at``."""
    found: dict[str, list[Span]] = {}
    for schedule, start, end in driver(conn).execute(
        """
        SELECT p.schedule,
               CASE WHEN isfinite(p.paused_at) THEN p.paused_at END,
               CASE WHEN p.resumed_at IS NULL AND c.paused IS FALSE
                    THEN greatest(c.changed_at, p.paused_at) ELSE p.resumed_at END AS ended
          FROM schedule_pauses p LEFT JOIN schedule_controls c USING (schedule)
         WHERE p.resumed_at IS NULL OR p.resumed_at > %(since)s
        UNION ALL
        SELECT c.schedule, NULL, NULL FROM schedule_controls c
         WHERE c.paused AND NOT EXISTS (SELECT FROM schedule_pauses p
                                         WHERE p.schedule = c.schedule AND p.resumed_at IS NULL)
        """,
        {"since": since},
    ):
        if end is None or end > since:
            found.setdefault(schedule, []).append((start, end))
    return {name: tuple(sorted(spans, key=_start)) for name, spans in found.items()}


_EVER = datetime.min.replace(tzinfo=UTC)


def _start(span: Span) -> datetime:
    return span[0] or _EVER


def pauses_prune(conn: psycopg.Connection, *, days: float, batch: int) -> int:
    """Retention (the SECURITY DEFINER ``schedule_pauses_prune()``), with the periods': spans
    resumed more than ``days`` ago."""
    return int(one_row(conn.execute(
        "SELECT schedule_pauses_prune(clock_timestamp() - make_interval(secs => %(s)s), %(b)s)",
        {"s": float(days) * 86400.0, "b": batch}))[0])
