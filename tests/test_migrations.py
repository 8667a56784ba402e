"""Migrations build the schema the table definitions describe, and apply safely in parallel."""

from __future__ import annotations

import threading
import uuid

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from cronkeeper.db import tables
from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import (
    available,
    latest_version,
    migrate,
    migrations_applied,
    require_current,
)
from cronkeeper.errors import SchemaBehind


def test_schema_built_by_migrations_matches_table_definitions(engine, schema):
    inspector = sa.inspect(engine)
    pg = postgresql.dialect()
    db_tables = set(inspector.get_table_names(schema=schema))
    assert db_tables == set(tables.metadata.tables)
    for name, table in tables.metadata.tables.items():
        columns = {c["name"]: c for c in inspector.get_columns(name, schema=schema)}
        assert set(columns) == {c.name for c in table.columns}, name
        for column in table.columns:
            db_col = columns[column.name]
            assert db_col["nullable"] == column.nullable, (name, column.name)
            assert db_col["type"].compile(dialect=pg) == column.type.compile(dialect=pg), (
                name,
                column.name,
            )
        pk = inspector.get_pk_constraint(name, schema=schema)["constrained_columns"]
        assert set(pk) == {c.name for c in table.primary_key.columns}, name


def test_concurrent_migrate_applies_each_version_once(database_url):
    name = f"t_{uuid.uuid4().hex[:12]}"
    engines = [make_engine(normalize_url(database_url), "public", pool_size=1) for _ in range(4)]
    results: list[list[int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(engines))

    def run(eng):
        barrier.wait()
        try:
            results.append(migrate(eng, name))
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        applied = sorted(v for r in results for v in r)
        assert applied == [m.version for m in available()]  # each once (numbers may have gaps)
        with engines[0].connect() as conn:
            assert migrations_applied(conn, name) == latest_version()
        require_current(engines[0], name)
    finally:
        with engines[0].begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        for e in engines:
            e.dispose()


def test_unmigrated_schema_is_refused_with_the_command_to_run(database_url):
    eng = make_engine(normalize_url(database_url), "public", pool_size=1)
    try:
        require_current(eng, f"t_{uuid.uuid4().hex[:12]}")
    except SchemaBehind as exc:
        assert "cronkeeper migrate" in str(exc)
    else:
        raise AssertionError("an empty schema was accepted")
    finally:
        eng.dispose()
