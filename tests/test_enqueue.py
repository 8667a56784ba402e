"""cronkeeper.enqueue: in the caller's transaction, through SQLAlchemy or psycopg."""

from datetime import datetime, timedelta

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


# -- enqueue_many -----------------------------------------------------------------------------


def rows(engine):
    with engine.connect() as conn:
        return conn.exec_driver_sql(
            "SELECT id, idempotency_key, task, payload, max_attempts, timeout_seconds, "
            "run_after > now() + interval '50 minutes' FROM outbox ORDER BY id").all()


def test_enqueue_many_is_atomic_with_the_callers_transaction(engine, schema, database_url):
    jobs = [{"task": "t", "key": f"k{n}", "payload": {"n": n}} for n in range(300)]
    with engine.connect() as conn:
        assert len(cronkeeper.enqueue_many(conn, jobs, schema=schema)) == 300
        conn.rollback()
    with psycopg.connect(plain_url(database_url)) as conn:
        cronkeeper.enqueue_many(conn, jobs, schema=schema)
        conn.rollback()
    assert rows(engine) == []
    with psycopg.connect(plain_url(database_url)) as conn:
        ids = cronkeeper.enqueue_many(conn, jobs, schema=schema)
        conn.commit()
    assert [r[1] for r in rows(engine)] == [f"k{n}" for n in range(300)]
    assert ids == [r[0] for r in rows(engine)]


def test_enqueue_many_keeps_order_and_reports_duplicates_as_none(engine, schema):
    with engine.begin() as conn:
        old = cronkeeper.enqueue(conn, "t", {"v": "old"}, key="exists", schema=schema)
    jobs = [
        {"task": "a", "key": "z-first", "payload": {"v": 1}},
        {"task": "b", "key": "exists", "payload": {"v": "new"}},  # an earlier transaction's key
        {"task": "c", "key": "m-middle", "payload": {"v": 3}, "max_attempts": 2, "timeout": 5},
        {"task": "d", "key": "z-first", "payload": {"v": 4}},  # repeats an earlier item
        {"task": "e", "key": "a-last", "run_after": timedelta(hours=1)},
    ]
    with engine.begin() as conn:
        ids = cronkeeper.enqueue_many(conn, jobs, schema=schema)
    assert ids[1] is None and ids[3] is None
    assert all(isinstance(i, int) for i in (ids[0], ids[2], ids[4]))
    assert ids[0] < ids[2] < ids[4]  # input order, not key order
    by_id = {r[0]: r[1:] for r in rows(engine)}
    assert len(by_id) == 4  # never a second job for a key
    assert by_id[old] == ("exists", "t", {"v": "old"}, 5, 600.0, False)  # left untouched
    assert by_id[ids[0]] == ("z-first", "a", {"v": 1}, 5, 600.0, False)  # the first item wins
    assert by_id[ids[2]] == ("m-middle", "c", {"v": 3}, 2, 5.0, False)
    assert by_id[ids[4]] == ("a-last", "e", {}, 5, 600.0, True)
    with engine.begin() as conn:  # called twice: all duplicates now
        assert cronkeeper.enqueue_many(conn, jobs, schema=schema) == [None] * 5
    assert len(rows(engine)) == 4
    with engine.begin() as conn:
        assert cronkeeper.enqueue_many(conn, [], schema=schema) == []
        assert cronkeeper.enqueue_many(conn, iter([{"task": "t", "key": "gen"}]), schema=schema)[0]


@pytest.mark.parametrize(("jobs", "message"), [
    ({"task": "t", "key": "k"}, "iterable of mappings"),
    ("not jobs", "iterable of mappings"),
    ([{"task": "t", "key": "ok"}, ("t", "k")], "jobs[1]: expected a mapping"),
    ([{"task": "t", "key": "ok"}, {"task": "t"}], "jobs[1]: 'task' and 'key' are required"),
    ([{"task": "t", "key": "k", "run_afetr": 5}], "jobs[0]: unknown key(s) run_afetr"),
    ([{"task": "", "key": "k"}], "jobs[0]: task must be a non-empty string"),
    ([{"task": "t", "key": 7}], "jobs[0]: key must be a non-empty string"),
    ([{"task": "t", "key": "k", "payload": [1, 2]}], "jobs[0]: payload must be a JSON object"),
    ([{"task": "t", "key": "k", "payload": {"x": float("nan")}}], "jobs[0]: payload and backoff must be strict JSON"),
    ([{"task": "t", "key": "k", "payload": {"x": object()}}], "jobs[0]: payload and backoff must be strict JSON"),
    ([{"task": "t", "key": "k", "max_attempts": 0}], "jobs[0]: max_attempts"),
    ([{"task": "t", "key": "k", "timeout": -1}], "jobs[0]: timeout"),
    ([{"task": "t", "key": "k", "run_after": "tomorrow"}], "jobs[0]: run_after"),
    ([{"task": "t", "key": "k", "run_after": datetime(2030, 1, 1)}], "jobs[0]: run_after must be timezone-aware"),
])
def test_enqueue_many_refuses_bad_input_and_writes_nothing(engine, schema, jobs, message):
    with engine.begin() as conn:
        with pytest.raises(UsageError) as err:
            cronkeeper.enqueue_many(conn, jobs, schema=schema)
        cronkeeper.enqueue(conn, "t", {}, key="kept", schema=schema)  # the transaction goes on
    assert message in str(err.value)
    assert [r[1] for r in rows(engine)] == ["kept"]


def test_enqueue_many_refuses_a_bad_schema_or_connection(engine):
    with engine.begin() as conn, pytest.raises(UsageError, match="invalid schema name"):
        cronkeeper.enqueue_many(conn, [{"task": "t", "key": "k"}], schema="Bad; DROP")
    with pytest.raises(UsageError, match="enqueue_many needs a SQLAlchemy Connection"):
        cronkeeper.enqueue_many(object(), [{"task": "t", "key": "k"}])  # type: ignore[arg-type]
