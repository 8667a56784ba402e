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


def test_a_version_named_by_a_period_or_a_job_cannot_be_deleted(engine):
    """The foreign keys to schedule_versions are gone (migration 6: a burst paid two row
    lookups and locks per period for them); versions are only added, and a trigger still
    refuses to delete or renumber one that a period or a job names, as the keys did."""
    import psycopg  # noqa: PLC0415

    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        ids = [raw.execute(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
            "VALUES (%s, 'd', '{}', now(), 1) RETURNING id", (name,)).fetchone()[0]
            for name in ("period", "job", "free")]
        raw.execute("INSERT INTO periods (schedule, scheduled_for, version_id, outcome, term) "
                    "VALUES ('period', now(), %s, 'emitted', 1)", (ids[0],))
        raw.execute("INSERT INTO outbox (idempotency_key, schedule, version_id, task) "
                    "VALUES ('job@x', 'job', %s, 't')", (ids[1],))
        raw.commit()
        for named in ids[:2]:
            for statement in ("DELETE FROM schedule_versions WHERE id = %s",
                              "UPDATE schedule_versions SET id = -id WHERE id = %s"):
                try:
                    raw.execute(statement, (named,))
                except psycopg.errors.ForeignKeyViolation as exc:
                    assert f"schedule version {named} is named" in str(exc)
                else:
                    raise AssertionError(f"{statement} of version {named} was not refused")
                finally:
                    raw.rollback()
        raw.execute("UPDATE schedule_versions SET digest = 'e' WHERE id = %s", (ids[0],))
        raw.execute("DELETE FROM schedule_versions WHERE id = %s", (ids[2],))
        raw.commit()
        assert sorted(r[0] for r in raw.execute("SELECT id FROM schedule_versions")) == ids[:2]
