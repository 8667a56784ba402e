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


# The fast subset is `pytest -m "not slow"` (README): pure and single-process tests, which may
# run a short CLI command. These modules are the rest: they start daemons, workers, relays,
# browsers, queue servers or a private PostgreSQL, or wait on real time, and are marked slow.
# tests/test_layout.py refuses a module that starts such processes without being listed here.
SLOW_MODULES = frozenset({
    "test_calendars_daemon", "test_clock_skew", "test_connections_exhausted", "test_daemon_burst_restart", "test_daemon_config", "test_disk_full", "test_daemon_failover", "test_daemon_netns_partition",
    "test_daemon_housekeeping", "test_daemon_outage", "test_daemon_partition",
    "test_daemon_resilience",
    "test_daemon_split_brain", "test_daemon_stall", "test_dlq", "test_dlq_flood", "test_summaries_daemon",
    "test_engine", "test_enqueue", "test_job_output", "test_history_acceptance", "test_metrics_daemon",
    "test_metrics_scrape_storm", "test_metrics_worker", "test_packaging", "test_pg_failover", "test_pooler",
    "test_quickstart", "test_relay", "test_relay_bullmq", "test_relay_celery",
    "test_relay_config", "test_relay_faults", "test_relay_rq", "test_relay_sidekiq", "test_relay_targets_e2e",
    "test_relay_targets_validate", "test_roles", "test_rolling_upgrade", "test_rules", "test_runtimes",
    "test_scale", "test_sidekiq_format", "test_soak", "test_soak_checks", "test_special_files",
    "test_start_without_database", "test_systemd", "test_wake_notify", "test_web_browser",
    "test_web_connections", "test_web_dlq_flood", "test_web_http", "test_web_inputs", "test_web_outage", "test_worker_chaos", "test_worker_commands", "test_worker_connections",
    "test_worker_idempotency", "test_worker_isolation", "test_worker_lost_connection",
    "test_worker_pg_restart", "test_worker_pid_one", "test_worker_process", "test_worker_wakeups", "test_notify_daemons",
    "test_notify_faults", "test_notify_deadline",
    "test_runtime_daemon", "test_runtime_unreadable", "test_daemon_pause"
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__ in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)

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
