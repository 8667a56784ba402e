"""Resolve where the database is (configured, or the embedded one) and open an engine: a
SQLAlchemy one, or for a reader that needs no more (status) a ``DirectEngine`` on psycopg alone."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cronkeeper import clock, embedded
from cronkeeper.db.engine import (
    DirectEngine,
    check_schema_name,
    direct_url,
    make_engine,
    normalize_url,
    redact,
)
from cronkeeper.db.migrate import migrate, require_compatible
from cronkeeper.errors import DatabaseError, SchemaIncompatible
from cronkeeper.outage import OutageReport, kind_of

if TYPE_CHECKING:
    from cronkeeper.db.engine import URL, Engine

log = logging.getLogger("cronkeeper.connect")


@dataclass
class Database:
    url: URL  # from open_direct: a str, already redacted (status only shows it)
    schema: str
    engine: Engine
    embedded: bool


def open_direct(database_url: str | None, schema: str, *, application_name: str) -> Database:
    """``open_database(database_url, schema, application_name=...)`` for a command that only
    reads through psycopg (status): the same checks and messages, without importing SQLAlchemy
    when the URL is plain and the schema current. Anything else (a host list, an escaped URL, a
    bad one, an embedded schema to migrate) goes through ``open_database`` itself."""
    check_schema_name(schema)
    raw = database_url or embedded.start()
    found = direct_url(raw)
    if found is None:
        return open_database(raw if database_url else None, schema,
                             application_name=application_name, _url=raw)
    params, shown = found
    engine = DirectEngine(params, schema, application_name=application_name)
    try:
        require_compatible(engine, schema)
    except SchemaIncompatible:
        if database_url:
            raise
        # The embedded schema is migrated, not checked (as open_database does).
        return open_database(None, schema, application_name=application_name, _url=raw)
    return Database(shown, schema, engine, not database_url)  # type: ignore[arg-type]  # see url


def open_database(
    database_url: str | None, schema: str, *, migrate_first: bool = False, check: bool = True,
    application_name: str = "cronkeeper", wait: bool = False, schema_needed: int | None = None,
    migrate_embedded: bool = True, _url: str | None = None, pool_size: int = 5,
) -> Database:
    """The embedded database is migrated always; a configured one only when asked to.

    ``wait`` (the daemon, the worker and the relay): a database that cannot be reached at start is waited
    for, with backoff (0.5 s doubling to 5 s), said when the wait begins, once a minute while it lasts
and when it ends (``cronkeeper.outage``), as it is once running; a
    process started during a restart or a failover must not exit for it. A schema that is
    behind, or an error that is not about connecting, still ends the command at once.

    ``schema_needed``: the oldest schema version the command works with (default: every
    migration this release ships; workers and relays also run on the previous release's).
    ``pool_size``: the connections the process keeps open for reuse (5 more are opened, and
    closed after use, when those are all taken)."""
    check_schema_name(schema)
    is_embedded = not database_url
    url = normalize_url(database_url or _url or embedded.start())
    engine = make_engine(url, schema, pool_size=pool_size, application_name=application_name)
    delay = 0.5
    outage = OutageReport()
    while True:
        try:
            if migrate_first or (is_embedded and migrate_embedded):
                migrate(engine, schema)
            elif check:
                require_compatible(engine, schema, needs=schema_needed)
            break
        except DatabaseError as exc:
            if not wait or isinstance(exc, SchemaIncompatible) or not _cannot_connect(exc):
                raise
            notice = outage.failed(clock.monotonic(), kind_of(str(exc)))
            if notice is not None and notice.first:
                log.warning("database unavailable at start (%s): %s; retrying in %.1fs (backoff "
                            "up to 5s; said again each minute while it lasts)", redact(url), exc,
                            delay, extra={"action": "db_unavailable"})
            elif notice is not None:
                log.warning("database still unavailable at start (%s): %s; for %.0fs, %d "
                            "failed tries", redact(url), exc, notice.lasted, notice.failures,
                            extra={"action": "db_unavailable"})
            clock.sleep(delay)
            delay = min(delay * 2, 5.0)
    notice = outage.recovered(clock.monotonic())
    if notice is not None:
        log.warning("database reachable after %.1fs (%d failed tries)", notice.lasted,
                    notice.failures, extra={"action": "db_reconnected"})
    return Database(url, schema, engine, is_embedded)


def _cannot_connect(exc: BaseException) -> bool:
    from cronkeeper.db.engine import CONNECTION_ERRORS

    cause = exc.__cause__
    return isinstance(cause, CONNECTION_ERRORS)
