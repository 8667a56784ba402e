"""Resolve where the database is (configured, or the embedded one) and open an engine."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cronkeeper import clock, embedded
from cronkeeper.db.engine import (
    CONNECTION_ERRORS,
    URL,
    Engine,
    check_schema_name,
    make_engine,
    normalize_url,
    redact,
)
from cronkeeper.db.migrate import migrate, require_compatible
from cronkeeper.errors import DatabaseError, SchemaIncompatible

log = logging.getLogger("cronkeeper.connect")


@dataclass
class Database:
    url: URL
    schema: str
    engine: Engine
    embedded: bool


def open_database(
    database_url: str | None, schema: str, *, migrate_first: bool = False, check: bool = True,
    application_name: str = "cronkeeper", wait: bool = False, schema_needed: int | None = None,
    migrate_embedded: bool = True,
) -> Database:
    """The embedded database is migrated always; a configured one only when asked to.

    ``wait`` (the daemon and the worker): a database that cannot be reached at start is waited
    for, with backoff (0.5 s doubling to 5 s) and a log line per try, as it is once running; a
    process started during a restart or a failover must not exit for it. A schema that is
    behind, or an error that is not about connecting, still ends the command at once.

    ``schema_needed``: the oldest schema version the command works with (default: every
    migration this release ships; workers and relays also run on the previous release's)."""
    check_schema_name(schema)
    is_embedded = not database_url
    url = normalize_url(database_url or embedded.start())
    engine = make_engine(url, schema, application_name=application_name)
    delay = 0.5
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
            log.warning("database unavailable at start (%s): %s; retrying in %.1fs",
                        redact(url), exc, delay, extra={"action": "db_unavailable"})
            clock.sleep(delay)
            delay = min(delay * 2, 5.0)
    return Database(url, schema, engine, is_embedded)


def _cannot_connect(exc: BaseException) -> bool:
    cause = exc.__cause__
    return isinstance(cause, CONNECTION_ERRORS)
