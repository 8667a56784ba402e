"""cronkeeper.enqueue: in the caller's transaction, through SQLAlchemy or psycopg."""

from datetime import timedelta

import psycopg
import pytest

import cronkeeper
from cronkeeper.errors import UsageError


def plain_url(database_url):
    return database_url.replace("postgresql+psycopg://", "postgresql://")


def keys(engine):
    with engine.connect() as conn:
        return {r[0] for r in conn.exec_driver_sql("SELECT idempotency_key FROM outbox")}


def test_sqlalchemy_commit_and_rollback(engine, schema):
    with engine.begin() as conn:
        job_id = cronkeeper.enqueue(conn, "mail.send", {"user": 1}, key="mail:1", schema=schema)
    assert isinstance(job_id, int)
    with engine.connect() as conn:
        cronkeeper.enqueue(conn, "mail.send", {"user": 2}, key="mail:2", schema=schema)
        conn.rollback()
    assert keys(engine) == {"mail:1"}


def test_psycopg_commit_and_rollback(engine, schema, database_url):
    with psycopg.connect(plain_url(database_url)) as conn:
        assert cronkeeper.enqueue(conn, "t", {}, key="pg:1", schema=schema) is not None
        conn.commit()
        cronkeeper.enqueue(conn, "t", {}, key="pg:2", schema=schema)
        conn.rollback()
    assert keys(engine) == {"pg:1"}


def test_duplicate_key_returns_none_and_keeps_the_first(engine, schema):
    with engine.begin() as conn:
        first = cronkeeper.enqueue(conn, "t", {"v": 1}, key="dup", schema=schema)
        assert cronkeeper.enqueue(conn, "t", {"v": 2}, key="dup", schema=schema) is None
    with engine.connect() as conn:
        row = conn.exec_driver_sql("SELECT id, payload FROM outbox WHERE idempotency_key = 'dup'").one()
    assert row == (first, {"v": 1})


def test_run_after_and_defaults(engine, schema):
    with engine.begin() as conn:
        cronkeeper.enqueue(conn, "t", None, key="later", schema=schema, run_after=timedelta(hours=1))
        cronkeeper.enqueue(conn, "t", None, key="now", schema=schema)
    with engine.connect() as conn:
        rows = dict(conn.exec_driver_sql(
            "SELECT idempotency_key, run_after > now() + interval '50 minutes' FROM outbox").all())
        state = conn.exec_driver_sql("SELECT DISTINCT state, attempts, max_attempts FROM outbox").all()
    assert rows == {"later": True, "now": False}
    assert state == [("available", 0, 5)]


def test_bad_arguments(engine, schema):
    with engine.begin() as conn, pytest.raises(UsageError):
        cronkeeper.enqueue(conn, "", {}, key="k", schema=schema)
    with engine.begin() as conn, pytest.raises(UsageError):
        cronkeeper.enqueue(conn, "t", {}, key="k", schema="Bad; DROP")
    with pytest.raises(UsageError):
        cronkeeper.enqueue(object(), "t", {}, key="k")  # type: ignore[arg-type]


def test_import_cronkeeper_stays_light():
    import subprocess
    import sys

    code = "import cronkeeper, sys; print('sqlalchemy' in sys.modules, 'psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
