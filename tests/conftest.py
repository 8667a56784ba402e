"""Shared fixtures: a real PostgreSQL, a freshly migrated schema and a unique cluster per test.

The database comes from CRONKEEPER_TEST_DATABASE_URL; unset, the local service on
127.0.0.1:5432 (database `test`) when it answers, otherwise the embedded PostgreSQL (pgserver,
a test dependency) started in a temporary directory for the session. A test that needs
PostgreSQL FAILS when it cannot get one; it never skips.
"""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest
import sqlalchemy as sa

from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import migrate

# handlers_for_tests provides the command_schedule fixture (and its handlers, for workers).
pytest_plugins = ["handlers_for_tests"]

DEFAULT_TEST_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _answers(url: str) -> str | None:
    """None when the database answers, else the reason it does not."""
    try:
        with psycopg.connect(libpq_url(url), connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure here means: no database
        return str(exc)
    return None


def libpq_url(url: str) -> str:
    return normalize_url(url).render_as_string(hide_password=False).replace(
        "postgresql+psycopg://", "postgresql://"
    )


@pytest.fixture(scope="session")
def database_url(tmp_path_factory) -> str:
    configured = os.environ.get("CRONKEEPER_TEST_DATABASE_URL")
    url = configured or DEFAULT_TEST_URL
    problem = _answers(url)
    if problem is None:
        return url
    if not configured:
        try:
            import warnings

            with warnings.catch_warnings():  # platformdirs: XDG_RUNTIME_DIR is not set
                warnings.simplefilter("ignore")
                import pgserver

            server = pgserver.get_server(tmp_path_factory.mktemp("pg") / "data", cleanup_mode="delete")
            url = server.get_uri()
            os.environ["CRONKEEPER_TEST_DATABASE_URL"] = url  # for subprocesses and helpers
            problem = _answers(url)
            if problem is None:
                return url
        except Exception as exc:  # noqa: BLE001 - reported below
            problem = f"{problem}; the embedded PostgreSQL failed too: {exc}"
    pytest.fail(
        f"these tests need PostgreSQL (set CRONKEEPER_TEST_DATABASE_URL); {url}: {problem}",
        pytrace=False,
    )


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
