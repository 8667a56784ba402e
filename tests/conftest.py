"""Shared fixtures: a real PostgreSQL, a freshly migrated schema and a unique cluster per test.

The database comes from CRONKEEPER_TEST_DATABASE_URL (default: the local service on
127.0.0.1:5432, database `test`). `.ci/run` provides one (the local service, or the embedded
pgserver). A test that needs PostgreSQL FAILS when it cannot get one; it never skips.
"""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest
import sqlalchemy as sa

from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import migrate

DEFAULT_TEST_URL = "postgresql://postgres@127.0.0.1:5432/test"


def test_database_url() -> str:
    return os.environ.get("CRONKEEPER_TEST_DATABASE_URL", DEFAULT_TEST_URL)


@pytest.fixture(scope="session")
def database_url() -> str:
    url = test_database_url()
    try:
        with psycopg.connect(
            normalize_url(url).render_as_string(hide_password=False).replace(
                "postgresql+psycopg://", "postgresql://"
            ),
            connect_timeout=5,
        ) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure here means: no database
        pytest.fail(
            f"these tests need PostgreSQL at {url} (set CRONKEEPER_TEST_DATABASE_URL); "
            f"could not connect: {exc}",
            pytrace=False,
        )
    return url


@pytest.fixture
def schema(database_url: str):
    """A freshly migrated schema of its own, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = make_engine(normalize_url(database_url), "public", pool_size=1)
    migrate(admin, name)
    yield name
    with admin.begin() as conn:
        conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    admin.dispose()


@pytest.fixture
def engine(database_url: str, schema: str):
    eng = make_engine(normalize_url(database_url), schema)
    yield eng
    eng.dispose()


@pytest.fixture
def cluster() -> str:
    """Advisory locks span the database: every test elects within a cluster of its own."""
    return f"c-{uuid.uuid4().hex[:10]}"


def scalar(engine: sa.Engine, sql: str, **params):
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()
