"""Resolve where the database is (configured, or the embedded one) and open an engine."""

from __future__ import annotations

from dataclasses import dataclass

from cronkeeper import embedded
from cronkeeper.db.engine import URL, Engine, check_schema_name, make_engine, normalize_url
from cronkeeper.db.migrate import migrate, require_current


@dataclass
class Database:
    url: URL
    schema: str
    engine: Engine
    embedded: bool


def open_database(
    database_url: str | None, schema: str, *, migrate_first: bool = False, check: bool = True,
    application_name: str = "cronkeeper",
) -> Database:
    """The embedded database is migrated always; a configured one only when asked to."""
    check_schema_name(schema)
    is_embedded = not database_url
    url = normalize_url(database_url or embedded.start())
    engine = make_engine(url, schema, application_name=application_name)
    if migrate_first or is_embedded:
        migrate(engine, schema)
    elif check:
        require_current(engine, schema)
    return Database(url, schema, engine, is_embedded)
