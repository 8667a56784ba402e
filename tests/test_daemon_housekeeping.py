"""The daemon's housekeeping thread (``election.Housekeeping``): its steps run apart, so one that
fails on every pass does not keep the others from running, and its failures are said once a
minute, never silently and never per pass. Real daemon, private PostgreSQL."""

from __future__ import annotations

import contextlib
import logging
import types
import uuid

import psycopg
import pytest
from daemon_harness import (
    Daemon,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)

from cronkeeper.election import Housekeeping

STALL = 2  # --stall-timeout


@pytest.fixture
def pg():
    return shared_postgres()


def _refuse_heartbeats(pg, schema: str, instance_id: str) -> None:
    """The database refuses this instance's heartbeat (as a permission, a full table or a
    broken trigger of the operator's would), and nothing else."""
    with set_path(pg.connect(), schema) as conn:
        conn.execute(
            "CREATE FUNCTION refuse_beat() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'test: heartbeat refused'; END $$")
        conn.execute(
            "CREATE TRIGGER refuse_beat BEFORE INSERT OR UPDATE ON instances FOR EACH ROW "
            f"WHEN (NEW.instance_id = '{instance_id}') EXECUTE FUNCTION refuse_beat()")


def _actions(daemon: Daemon, action: str) -> list[dict]:
    return [r for r in daemon.records() if r.get("action") == action]


def test_a_stalled_leader_steps_down_while_its_heartbeat_is_refused(pg, tmp_path):
    """Before the steps ran apart, the heartbeat's error skipped the rest of each pass: a
    leader whose heartbeat the database refused never stepped down when its work hung, and
    said so only at debug level."""
    schema = pg.new_schema()
    directory = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("s", cron="* * * * * *")})
    name = f"i-{uuid.uuid4().hex[:6]}"
    daemon = Daemon(url=pg.url, schema=schema, cluster=f"c-{uuid.uuid4().hex[:8]}",
                    schedules=directory, instance_id=name, log_dir=tmp_path,
                    stall_timeout=STALL, leader_timeout=30).start()
    locker: psycopg.Connection | None = None
    try:
        daemon.wait_log(lambda r: r.get("action") == "leader_won", 30, "leads")
        _refuse_heartbeats(pg, schema, name)
        failed = daemon.wait_log(lambda r: r.get("action") == "housekeeping_failed", 15,
                                 "says its heartbeat is refused")
        assert "writing the instance heartbeat" in failed["message"]
        assert "heartbeat refused" in failed["message"]

        # Its work hangs: every period it would claim waits on a lock.
        locker = set_path(pg.connect(), schema)
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE periods IN ACCESS EXCLUSIVE MODE")
        daemon.wait_log(lambda r: r.get("action") == "leader_stalled", STALL + 15,
                        "steps down although its heartbeat fails on every pass")
        locker.execute("ROLLBACK")

        # Failing every second for the whole test, said once (the next line is due a minute on).
        assert len(_actions(daemon, "housekeeping_failed")) == 1, daemon.log_text()[-3000:]

        with set_path(pg.connect(), schema) as conn:
            conn.execute("DROP TRIGGER refuse_beat ON instances")
        recovered = daemon.wait_log(lambda r: r.get("action") == "housekeeping_recovered", 15,
                                    "says its heartbeat is written again")
        assert "writing the instance heartbeat" in recovered["message"]
        assert float(recovered["message"].split("after=")[1].split("s")[0]) >= Housekeeping.GRACE
        wait_for(lambda: _beaten(pg, schema, name), 10, "the heartbeat is written again")
        assert daemon.alive()
    finally:
        if locker is not None:
            with contextlib.suppress(psycopg.Error):
                locker.close()
        daemon.stop()
    assert "Traceback" not in daemon.log_text()


def _beaten(pg, schema: str, name: str) -> bool:
    with set_path(pg.connect(), schema) as conn:
        row = conn.execute("SELECT clock_timestamp() - heartbeat_at < interval '3 seconds' "
                           "FROM instances WHERE instance_id = %s", (name,)).fetchone()
    return bool(row and row[0])


def test_a_bug_in_a_step_is_said_with_its_traceback_once_and_the_other_steps_go_on(caplog):
    """A step raising on every pass (a bug, not the database) is said at ERROR with its
    traceback the first time, then not again within the minute; a later step still runs, and a
    database error is said as one of its own (not as a bug)."""
    node = types.SimpleNamespace(database_away=False)
    housekeeping = Housekeeping(node)  # type: ignore[arg-type] - _step reads database_away only
    ran = []
    # A blip shorter than GRACE is not said (each step is tried again every second).
    assert housekeeping._step("deposing a stale leader", lambda: _refused()) is False
    assert housekeeping._step("deposing a stale leader", lambda: None) is True
    housekeeping.GRACE = 0.0

    def broken() -> None:
        raise KeyError("schedules_digest")

    def refused() -> None:
        _refused()

    caplog.set_level(logging.WARNING, logger="cronkeeper.election")
    assert not caplog.records
    for _ in range(5):
        assert housekeeping._step("writing the instance heartbeat", broken) is False
        assert housekeeping._step("deposing a stale leader", refused) is False
        assert housekeeping._step("stepping down", lambda: ran.append(1)) is True
    assert len(ran) == 5
    bugs = [r for r in caplog.records if getattr(r, "action", None) == "internal_error"]
    assert len(bugs) == 1 and bugs[0].levelno == logging.ERROR
    assert bugs[0].exc_info is not None and "KeyError" in bugs[0].getMessage()
    failed = [r for r in caplog.records if getattr(r, "action", None) == "housekeeping_failed"]
    assert len(failed) == 1 and "deposing a stale leader" in failed[0].getMessage()

    node.database_away = True  # the session says the database is away: not said twice
    caplog.clear()
    housekeeping._outages.clear()
    assert housekeeping._step("deposing a stale leader", refused) is False
    assert not [r for r in caplog.records if getattr(r, "action", None) == "housekeeping_failed"]


def _refused() -> None:
    raise psycopg.errors.RaiseException("test: heartbeat refused")
