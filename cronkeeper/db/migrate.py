"""Versioned migrations: numbered SQL files shipped inside the package, one transaction each,
applied under an advisory lock so that instances starting together migrate once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import sqlalchemy as sa

from cronkeeper.db.engine import migration_lock_key, translate_errors
from cronkeeper.errors import SchemaBehind

FILE_PATTERN = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def available() -> list[Migration]:
    found = []
    for entry in resources.files("cronkeeper.migrations").iterdir():
        match = FILE_PATTERN.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    return sorted(found, key=lambda m: m.version)


def latest_version() -> int:
    return available()[-1].version


def migrations_applied(conn: sa.Connection, schema: str) -> int:
    """The schema's version: 0 when the schema or its bookkeeping table does not exist."""
    exists = conn.execute(
        sa.text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"{schema}.schema_migrations"}
    ).scalar_one()
    if not exists:
        return 0
    return conn.execute(
        sa.text(f'SELECT coalesce(max(version), 0) FROM "{schema}".schema_migrations')
    ).scalar_one()


def migrate(engine: sa.Engine, schema: str) -> list[int]:
    """Apply every pending migration; return the versions applied (empty when current)."""
    applied: list[int] = []
    with translate_errors("migrating the database"), engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": migration_lock_key(schema)})
        try:
            conn.commit()
            exists = conn.execute(
                sa.text("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = :s)"),
                {"s": schema},
            ).scalar_one()
            if not exists:  # IF NOT EXISTS still needs CREATE on the database; an owner may lack it
                conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            conn.exec_driver_sql(
                f'CREATE TABLE IF NOT EXISTS "{schema}".schema_migrations ('
                "version integer PRIMARY KEY, name text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.commit()
            current = migrations_applied(conn, schema)
            conn.commit()
            for migration in available():
                if migration.version <= current:
                    continue
                conn.exec_driver_sql(f'SET LOCAL search_path TO "{schema}"')
                conn.exec_driver_sql(migration.sql)
                conn.execute(
                    sa.text(
                        f'INSERT INTO "{schema}".schema_migrations (version, name) VALUES (:v, :n)'
                    ),
                    {"v": migration.version, "n": migration.name},
                )
                conn.commit()
                applied.append(migration.version)
        finally:
            conn.rollback()
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": migration_lock_key(schema)})
            conn.commit()
    return applied


def require_current(engine: sa.Engine, schema: str) -> None:
    """Refuse to run against a schema that is behind (or ahead of) this cronkeeper."""
    with translate_errors("checking the schema version"), engine.connect() as conn:
        current = migrations_applied(conn, schema)
    latest = latest_version()
    if current < latest:
        raise SchemaBehind(
            f"schema {schema!r} is at version {current}, this cronkeeper needs {latest}: "
            "run `cronkeeper migrate` (or start with --migrate)"
        )
    if current > latest:
        raise SchemaBehind(
            f"schema {schema!r} is at version {current}, newer than this cronkeeper knows "
            f"({latest}): upgrade cronkeeper on this host"
        )
