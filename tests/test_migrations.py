"""Migrations build the schema the table definitions describe, and apply safely in parallel."""

from __future__ import annotations

import threading
import uuid

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from cronkeeper.db import tables
from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import (
    PREVIOUS_RELEASE_SCHEMA,
    SchemaState,
    available,
    check_compatible,
    latest_version,
    migrate,
    migrations_applied,
    release_key,
    require_compatible,
    schema_state,
)
from cronkeeper.errors import SchemaAhead, SchemaBehind


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
        require_compatible(engines[0], name)
    finally:
        with engines[0].begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        for e in engines:
            e.dispose()


def test_unmigrated_schema_is_refused_with_the_command_to_run(database_url):
    eng = make_engine(normalize_url(database_url), "public", pool_size=1)
    try:
        require_compatible(eng, f"t_{uuid.uuid4().hex[:12]}")
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


# -- the upgrade policy (docs/upgrading.md) ---------------------------------------------------

def test_every_migration_says_the_oldest_release_that_works_with_it():
    migrations = available()
    for m in migrations:
        assert m.sql.startswith(f"-- oldest release: {m.oldest_release}\n"), m.name
        release_key(m.oldest_release)  # a release number
    # Within 0.x every migration so far keeps 0.1.0 working: none of them removed or narrowed.
    assert {m.oldest_release for m in migrations} == {"0.1.0"}


# What a minor release's migration may not do: each would break the previous release's code
# running beside it (a column it reads or writes, a value it stores, a row it inserts).
NARROWING = [
    (r"\bDROP\s+(TABLE|VIEW|FUNCTION|TYPE|SEQUENCE)\b", "drops an object"),
    (r"\bDROP\s+COLUMN\b", "drops a column"),
    (r"\bRENAME\b", "renames"),
    (r"\bSET\s+NOT\s+NULL\b", "makes a column NOT NULL"),
    (r"\bALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE\b", "changes a column's type"),
    (r"\bADD\s+COLUMN\b(?:(?!,\s*ADD\b)[^;])*\bNOT\s+NULL\b(?:(?!\bDEFAULT\b)[^;,])*(;|,)",
     "adds a NOT NULL column without a default"),
]


def narrowing(sql: str) -> list[str]:
    import re  # noqa: PLC0415

    text = re.sub(r"--[^\n]*", "", sql)
    return [why for pattern, why in NARROWING if re.search(pattern, text, re.I)]


def test_the_narrowing_check_catches_what_it_names():
    assert narrowing("ALTER TABLE outbox ADD COLUMN x int NOT NULL;") == [
        "adds a NOT NULL column without a default"]
    assert narrowing("ALTER TABLE outbox ADD COLUMN x int NOT NULL DEFAULT 0;") == []
    assert narrowing("ALTER TABLE outbox ADD COLUMN x int;") == []
    assert narrowing("ALTER TABLE outbox DROP COLUMN task;") == ["drops a column"]
    assert narrowing("ALTER TABLE periods ALTER COLUMN reason SET NOT NULL;") == [
        "makes a column NOT NULL"]
    assert narrowing("ALTER TABLE periods RENAME COLUMN reason TO why;") == ["renames"]
    assert narrowing("-- DROP TABLE outbox;\nCREATE INDEX i ON outbox (id);") == []


def test_migrations_since_the_last_release_only_add():
    """A static first line of defence; tests/test_rolling_upgrade.py is the proof (the previous
    release's code running on the new schema). A widened CHECK drops and re-adds its constraint:
    that is allowed, dropping an index or constraint is not listed above for that reason."""
    since_release = [m for m in available() if m.version > PREVIOUS_RELEASE_SCHEMA]
    assert since_release, "no migration since 0.1.0: keep this test meaningful"
    assert {m.name: narrowing(m.sql) for m in since_release if narrowing(m.sql)} == {}


def test_a_newer_compatible_schema_is_accepted_and_an_incompatible_one_refused():
    current = latest_version()
    check_compatible(SchemaState(current + 1, "0.1.0"), "s", release="0.2.0")  # only added
    try:
        check_compatible(SchemaState(current + 1, "0.3.0"), "s", release="0.2.0.dev0")
    except SchemaAhead as exc:
        assert "needs cronkeeper 0.3.0 or newer (this is 0.2.0.dev0)" in str(exc)
        assert "install cronkeeper 0.3.0 or newer on this host" in str(exc)
    else:
        raise AssertionError("a schema that needs a newer release was accepted")


def test_workers_run_on_the_previous_release_schema_the_daemon_does_not():
    behind = SchemaState(PREVIOUS_RELEASE_SCHEMA, "0.1.0")
    check_compatible(behind, "s", needs=PREVIOUS_RELEASE_SCHEMA)  # a worker or a relay
    try:
        check_compatible(behind, "s")  # the daemon and the operator commands
    except SchemaBehind as exc:
        assert f"is at version {PREVIOUS_RELEASE_SCHEMA}" in str(exc)
        assert "run `cronkeeper migrate`" in str(exc)
    else:
        raise AssertionError("the daemon accepted a schema missing this release's migrations")


def test_migrate_records_each_migrations_oldest_release_and_fills_in_old_rows(engine, schema):
    with engine.begin() as conn:
        rows = conn.exec_driver_sql(
            f'SELECT version, oldest_release FROM "{schema}".schema_migrations ORDER BY 1').all()
        assert rows == [(m.version, m.oldest_release) for m in available()]
        # As 0.1.0 left it: no oldest_release column at all.
        conn.exec_driver_sql(f'ALTER TABLE "{schema}".schema_migrations DROP COLUMN oldest_release')
        assert schema_state(conn, schema) == SchemaState(latest_version(), "0.1.0")
    assert migrate(engine, schema) == []
    with engine.begin() as conn:
        rows = conn.exec_driver_sql(
            f'SELECT version, oldest_release FROM "{schema}".schema_migrations ORDER BY 1').all()
        assert rows == [(m.version, m.oldest_release) for m in available()]
        conn.exec_driver_sql(f"INSERT INTO \"{schema}\".schema_migrations VALUES "
                             "(9000, 'from_the_future', now(), '0.4.0')")
        assert schema_state(conn, schema) == SchemaState(9000, "0.4.0")
    try:
        require_compatible(engine, schema)
    except SchemaAhead as exc:
        assert "version 9000, which needs cronkeeper 0.4.0 or newer" in str(exc)
    else:
        raise AssertionError("a schema migrated by 0.4.0 was accepted")
