"""Versioned migrations: numbered SQL files shipped inside the package, one transaction each,
applied under an advisory lock so that instances starting together migrate once.

The upgrade policy (docs/upgrading.md): a minor release's migrations only add, so code of the
previous minor release keeps working on the schema they leave. Each file says, in its first
line (``-- oldest release: X.Y.Z``), the oldest release whose code works with the schema it
leaves; ``migrate`` records that beside the version, so an instance of any release can tell at
start whether a schema migrated by a newer one is still compatible with it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

from cronkeeper import __version__
from cronkeeper.db.engine import driver, migration_lock_key, one_row, translate_errors
from cronkeeper.errors import SchemaAhead, SchemaBehind

FILE_PATTERN = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
OLDEST_RELEASE = re.compile(r"-- oldest release: (\d+\.\d+\.\d+)\n")
FIRST_RELEASE = "0.1.0"  # rows recorded by 0.1.0, which kept no oldest release, count as it

# The schema the previous minor release (0.1.0) left. Workers and relays of this release run on
# it as well, so a rolling upgrade can start with them before ``migrate`` runs; the daemon and
# the operator commands need every migration this release ships. tests/test_rolling_upgrade.py
# holds this true by running a worker of this release on that schema.
PREVIOUS_RELEASE_SCHEMA = 7

if TYPE_CHECKING:  # migrate() imports it; reading the schema's version runs on psycopg alone
    import psycopg
    import sqlalchemy as sa


def release_key(version: str) -> tuple[int, int, int]:
    """``major.minor.patch`` as a tuple to compare; a development or pre-release suffix
    (``0.2.0.dev0``) counts as the release it leads to."""
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a release version: {version!r}")
    return int(match[1]), int(match[2]), int(match[3])


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str
    oldest_release: str  # the oldest release whose code works with the schema this one leaves


@dataclass(frozen=True, slots=True)
class SchemaState:
    version: int  # the highest migration applied (0: none)
    oldest_release: str  # the oldest release that works with it: the most any applied one says


def available() -> list[Migration]:
    found = []
    for entry in resources.files("cronkeeper.migrations").iterdir():
        match = FILE_PATTERN.fullmatch(entry.name)
        if match:
            sql = entry.read_text(encoding="utf-8")
            oldest = OLDEST_RELEASE.match(sql)
            if oldest is None:
                raise ValueError(f"migration {entry.name} does not begin with "
                                 "'-- oldest release: X.Y.Z' (docs/upgrading.md)")
            found.append(Migration(int(match[1]), match[2], sql, oldest[1]))
    return sorted(found, key=lambda m: m.version)


def latest_version() -> int:
    return available()[-1].version


def migrations_applied(conn: sa.Connection | psycopg.Connection, schema: str) -> int:
    """The schema's version: 0 when the schema or its bookkeeping table does not exist."""
    cur = driver(conn)
    exists = one_row(cur.execute("SELECT to_regclass(%(t)s) IS NOT NULL",
                                 {"t": f"{schema}.schema_migrations"}))[0]
    if not exists:
        return 0
    return one_row(cur.execute(f'SELECT coalesce(max(version), 0) FROM "{schema}".schema_migrations'))[0]


def schema_state(conn: sa.Connection | psycopg.Connection, schema: str) -> SchemaState:
    """The schema's version and the oldest release that works with it (SQL only: on a
    SQLAlchemy connection or a psycopg one)."""
    version = migrations_applied(conn, schema)
    if version == 0:
        return SchemaState(0, FIRST_RELEASE)
    cur = driver(conn)
    has_column = one_row(cur.execute(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = %(s)s"
        " AND table_name = 'schema_migrations' AND column_name = 'oldest_release')",
        {"s": schema},
    ))[0]
    releases = [r for (r,) in cur.execute(
        f'SELECT DISTINCT oldest_release FROM "{schema}".schema_migrations'
    ).fetchall()] if has_column else []
    oldest = max((r or FIRST_RELEASE for r in releases), key=release_key, default=FIRST_RELEASE)
    return SchemaState(version, oldest)


def pending(conn: sa.Connection, schema: str) -> list[Migration]:
    """The migrations ``migrate`` would apply now."""
    current = migrations_applied(conn, schema)
    return [m for m in available() if m.version > current]


def migrate(engine: sa.Engine, schema: str) -> list[int]:
    """Apply every pending migration; return the versions applied (empty when current)."""
    import sqlalchemy as sa

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
                "applied_at timestamptz NOT NULL DEFAULT now(), oldest_release text)"
            )
            # A schema 0.1.0 made has no oldest_release column: add it, and fill in what each
            # migration this release knows says (one already applied keeps its number).
            conn.exec_driver_sql(
                f'ALTER TABLE "{schema}".schema_migrations ADD COLUMN IF NOT EXISTS oldest_release text'
            )
            for known in available():
                conn.execute(
                    sa.text(f'UPDATE "{schema}".schema_migrations SET oldest_release = :r '
                            "WHERE version = :v AND oldest_release IS NULL"),
                    {"r": known.oldest_release, "v": known.version},
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
                        f'INSERT INTO "{schema}".schema_migrations (version, name, oldest_release) '
                        "VALUES (:v, :n, :r)"
                    ),
                    {"v": migration.version, "n": migration.name, "r": migration.oldest_release},
                )
                conn.commit()
                applied.append(migration.version)
        finally:
            conn.rollback()
            conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": migration_lock_key(schema)})
            conn.commit()
    return applied


def check_compatible(state: SchemaState, schema: str, *, needs: int | None = None,
                     release: str = __version__) -> None:
    """Refuse a schema older than this release needs (``needs``: by default every migration it
    ships) or migrated by a newer release that this one is too old for; the message says which
    command to run or which release to install. A newer schema whose oldest release is this one
    or older is compatible: its migrations only added."""
    needed = latest_version() if needs is None else needs
    if state.version < needed:
        raise SchemaBehind(
            f"schema {schema!r} is at version {state.version}, this cronkeeper ({release}) "
            f"needs version {needed}: run `cronkeeper migrate` (or start with --migrate)"
        )
    if release_key(state.oldest_release) > release_key(release):
        raise SchemaAhead(
            f"schema {schema!r} is at version {state.version}, which needs cronkeeper "
            f"{state.oldest_release} or newer (this is {release}): install cronkeeper "
            f"{state.oldest_release} or newer on this host"
        )


def require_compatible(engine: Any, schema: str, *, needs: int | None = None) -> SchemaState:
    """``check_compatible`` against the schema as it is now: ``engine`` is SQLAlchemy's or a
    ``DirectEngine`` (status, on psycopg alone)."""
    with translate_errors("checking the schema version"), engine.connect() as conn:
        state = schema_state(conn, schema)
    check_compatible(state, schema, needs=needs)
    return state
