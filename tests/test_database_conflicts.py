"""A deadlock or serialization failure met by a worker or relay (``claiming.ClaimingDatabase``):
the database answered and rolled one transaction back, so it is said as a conflict, tried
again, and never as the database being away (which opened an outage and, at the next
success, "database reconnected" after 0 s). Real PostgreSQL, a real deadlock."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from cronkeeper.claiming import ClaimingDatabase
from cronkeeper.db.engine import conflicts, make_engine, normalize_url
from cronkeeper.errors import DatabaseError


def a_real_deadlock(libpq: str) -> psycopg.Error:
    """Two transactions each holding one row and reaching for the other's: the error
    PostgreSQL gives the one it rolls back."""
    a, b = psycopg.connect(libpq), psycopg.connect(libpq)
    try:
        for conn in (a, b):
            conn.execute("SET deadlock_timeout = '100ms'")
        a.execute("SELECT pg_advisory_xact_lock(910001)")
        b.execute("SELECT pg_advisory_xact_lock(910002)")
        errors: list[psycopg.Error] = []

        def reach(conn: psycopg.Connection, key: int) -> None:
            try:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            except psycopg.Error as exc:
                errors.append(exc)
                conn.rollback()  # frees its lock: the other one gets it

        other = threading.Thread(target=reach, args=(b, 910001))
        other.start()
        reach(a, 910002)
        other.join(10)
        assert len(errors) == 1, errors
        return errors[0]
    finally:
        a.close()
        b.close()


def test_a_deadlock_is_a_conflict_said_once_not_the_database_away(database_url, schema, caplog):
    from conftest import libpq_url

    deadlock = a_real_deadlock(libpq_url(database_url))
    assert deadlock.sqlstate == "40P01"
    assert conflicts(deadlock)
    assert not conflicts(DatabaseError("deadlock detected"))  # words are not a SQLSTATE

    engine = make_engine(normalize_url(database_url), schema, pool_size=2)
    db = ClaimingDatabase(engine)
    caplog.set_level(logging.INFO, logger="cronkeeper.worker")
    try:
        for _ in range(3):  # the same conflict three times in a row: said once
            with pytest.raises(DatabaseError, match="deadlock detected"), \
                    db.statement("recording job endings"):
                raise deadlock
        assert not db.is_down
        with db.statement("recording job endings") as conn:  # the retry succeeds
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        engine.dispose()
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions.count("database_conflict") == 1, caplog.text
    assert "database_unavailable" not in actions, caplog.text
    assert "database_reconnected" not in actions, caplog.text
    said = next(r for r in caplog.records if getattr(r, "action", None) == "database_conflict")
    assert "while=recording job endings" in said.getMessage()
    assert "deadlock detected" in said.getMessage()


def test_a_connection_error_is_still_the_database_away(database_url, schema, caplog):
    """The other side of the line: a refused connection is an outage, said and ended."""
    engine = make_engine(normalize_url(database_url.replace(":5432", ":1")), schema, pool_size=1)
    db = ClaimingDatabase(engine)
    caplog.set_level(logging.INFO, logger="cronkeeper.worker")
    try:
        with pytest.raises(DatabaseError), db.statement("claiming jobs"):
            pass
        assert db.is_down
    finally:
        engine.dispose()
    actions = [getattr(r, "action", None) for r in caplog.records]
    assert actions.count("database_unavailable") == 1, caplog.text
    assert "database_conflict" not in actions
