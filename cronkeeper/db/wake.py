"""Wake-ups: LISTEN/NOTIFY on one channel per schema, so an idle worker claims a job within
milliseconds of the commit that made it available, instead of at its next poll.

Every statement that makes jobs available (an application's enqueue, the leader's period
claim, a retry or a release, a reaped lease, a dead letter replayed, a job handed back) calls
``pg_notify`` itself, at most once per statement, on the rows it wrote: ``WAKE`` below is the
fragment they share. PostgreSQL delivers a notification when (and only if) its transaction
commits, and folds identical ones sent in one transaction into one, so workers hear one
notification per committing transaction, however many jobs it wrote, and nothing for a
transaction rolled back: the outbox guarantee holds for the wake-up too.

Why explicit calls rather than a trigger on ``outbox``: a statement-level trigger would need a
transition table, which makes PostgreSQL copy every row of *every* statement on the table
(each claim, completion and lease extension: the worker's hot path, thousands of rows a second)
to find the few statements that make a job available; a row-level trigger would call
``pg_notify`` once per job. The cost of the explicit calls is discipline: a new statement that
makes jobs available must include ``WAKE`` (the worker's poll covers one that forgets). Other
programs that insert rows into the outbox directly can wake the workers the same way:
``SELECT pg_notify('cronkeeper.<schema>', '')`` in their transaction.

The payload is empty: a notification only says "look now". A worker that hears one claims what
is due and, when nothing is, sleeps until the earliest ``run_after`` (so a job due in 3 s also
wakes idle workers, which then sleep 3 s rather than a whole poll interval).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from cronkeeper.db.engine import check_schema_name, conninfo

if TYPE_CHECKING:  # annotations only: status runs without SQLAlchemy
    from sqlalchemy.engine import URL

CHANNEL_PREFIX = "cronkeeper."
CHANNEL_MAX = 63  # PostgreSQL identifiers (and channel names) are at most NAMEDATALEN - 1 bytes

# The channel, spelled in SQL for statements that run with the schema first on search_path (the
# worker's, the leader's and the CLI's connections). Same rule as ``wake_channel``: a name cut at
# 63 bytes can only be shared by schemas whose names agree on their first 52 characters, and
# that costs them spurious wake-ups (an empty claim), never a missed job.
CHANNEL_SQL = f"left('{CHANNEL_PREFIX}' || current_schema(), {CHANNEL_MAX})"


# Notifications to send (docs/notifications.md) have a channel of their own, so that a dead
# letter's notification wakes the senders, not every idle worker's claim loop.
NOTES_PREFIX = "cronkeeper-notify."
NOTES_CHANNEL_SQL = f"left('{NOTES_PREFIX}' || current_schema(), {CHANNEL_MAX})"


# Runtime schedules (cronkeeper.schedules) changed: wakes the leader, which adopts the change
# (docs/runtime-schedules.md). Sent by each put or delete statement that wrote a row.
SCHEDULES_PREFIX = "cronkeeper-schedules."


def schedules_channel(schema: str) -> str:
    """The channel the leader of ``schema`` LISTENs on for runtime schedule changes."""
    return (SCHEDULES_PREFIX + check_schema_name(schema))[:CHANNEL_MAX]


def wake_channel(schema: str) -> str:
    """The channel workers of ``schema`` LISTEN on."""
    return (CHANNEL_PREFIX + check_schema_name(schema))[:CHANNEL_MAX]


def notes_channel(schema: str) -> str:
    """The channel the notification senders of ``schema`` LISTEN on."""
    return (NOTES_PREFIX + check_schema_name(schema))[:CHANNEL_MAX]


def wake(source: str, channel: str = CHANNEL_SQL) -> str:
    """A CTE body that calls ``pg_notify`` once when the CTE ``source`` returned any row (and not
    at all otherwise). Name it and join it into the statement's final SELECT (``FROM x, woke``):
    PostgreSQL runs a SELECT in a WITH only as far as the outer query reads it. ``source`` is
    the name of a data-modifying CTE, optionally with a WHERE clause."""
    return f"SELECT count(*) AS woke FROM (SELECT pg_notify({channel}, '') FROM {source} LIMIT 1) w"


def listen_connect(url: URL, application_name: str) -> psycopg.Connection:
    """A dedicated autocommit session for LISTEN (a pooled connection would be handed to other
    work, and a LISTEN lives exactly as long as its session)."""
    return psycopg.connect(conninfo(url), autocommit=True, application_name=application_name,
                           connect_timeout=10)


def listen(conn: psycopg.Connection, channel: str) -> None:
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def notified(conn: psycopg.Connection, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a notification on the session; True when one (or more:
    all waiting ones are consumed) came."""
    got = False
    for _ in conn.notifies(timeout=timeout, stop_after=1):
        got = True
    if got:  # take the others already queued, without waiting
        for _ in conn.notifies(timeout=0):
            pass
    return got

