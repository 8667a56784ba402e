"""The stall watchdog (SPEC §6: leadership means progress): a leader whose work hangs steps
down; a leader whose work is large but moves on does not (issue 21).

Adopting a set, reading it back after a takeover and catching up are work that grows with the
set; the watchdog must see it progress batch by batch, or a fixed ``--stall-timeout`` steps
every term down before its first tick and the next term starts over. Real daemons, on the
private PostgreSQL, beside busy loops this test starts (and kills) to slow them down.
"""

from __future__ import annotations

import uuid

import pytest
from daemon_harness import (
    Daemon,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)
from faults import busy_loops

SCHEDULES = 30_000
FILES = 30
STALL = 2  # --stall-timeout: far shorter than adopting or reading back the set takes
BUSY_LOOPS = 2


@pytest.fixture
def pg():
    return shared_postgres()


def _count(pg, schema: str, sql: str, *args: object) -> int:
    with set_path(pg.connect(), schema) as conn:
        return conn.execute(sql, args).fetchone()[0]


def _emitted(pg, schema: str, after_term: int) -> int:
    return _count(pg, schema, "SELECT count(*) FROM periods WHERE outcome = 'emitted' AND "
                              "term > %s", after_term)


def _stalls(daemon: Daemon) -> list[dict]:
    return [r for r in daemon.records() if r.get("action") == "leader_stalled"]


def test_a_large_set_fires_on_a_busy_machine_at_start_and_after_a_takeover(pg, tmp_path):
    schema = pg.new_schema()
    per_file = SCHEDULES // FILES
    directory = write_schedules(tmp_path / "s", {
        f"f{f:02d}.toml": "\n".join(
            schedule_toml(f"s{f:02d}-{i:04d}", cron="*/10 * * * * *", misfire="skip")
            for i in range(per_file))
        for f in range(FILES)})
    cluster = f"c-{uuid.uuid4().hex[:8]}"

    def daemon(name: str) -> Daemon:
        return Daemon(url=pg.url, schema=schema, cluster=cluster, schedules=directory,
                      instance_id=name, log_dir=tmp_path, stall_timeout=STALL,
                      leader_timeout=30)

    first, second = daemon("first"), daemon("second")
    with busy_loops(BUSY_LOOPS):
        try:
            # A first start: every version is new, recorded batch by batch, then the set fires.
            first.start()
            wait_for(lambda: _emitted(pg, schema, after_term=0) >= SCHEDULES, 90,
                     "the first start fires every schedule once")
            assert _stalls(first) == [], first.log_text()[-3000:]
            assert _count(pg, schema, "SELECT max(term) FROM leadership") == 1

            # A takeover: the next leader reads every version back and catches up first.
            first.kill()
            second.start()
            wait_for(lambda: _emitted(pg, schema, after_term=1) >= SCHEDULES, 90,
                     "the next leader fires every schedule once")
            assert _stalls(second) == [], second.log_text()[-3000:]
            assert _count(pg, schema, "SELECT max(term) FROM leadership") == 2
        finally:
            second.kill()
            first.kill()
    # No period decided twice, and every emitted period has its one job.
    assert _count(pg, schema, "SELECT count(*) FROM (SELECT 1 FROM outbox GROUP BY schedule, "
                              "scheduled_for HAVING count(*) > 1) d") == 0
    assert _count(pg, schema, "SELECT (SELECT count(*) FROM periods WHERE outcome = 'emitted') "
                              "- (SELECT count(*) FROM outbox)") == 0


def test_a_leader_whose_tick_hangs_steps_down_and_leads_again_once_it_is_free(pg, tmp_path):
    """A hung query: another session holds ``periods`` locked, so the leader's next claim
    waits on it and its tick makes no progress. It steps down within the bound, and once the
    lock is gone it leads again, under a new term, and fires."""
    schema = pg.new_schema()
    directory = write_schedules(tmp_path / "s", {"a.toml": schedule_toml(
        "tick", cron="* * * * * *", misfire="skip")})
    leader = Daemon(url=pg.url, schema=schema, cluster=f"c-{uuid.uuid4().hex[:8]}",
                    schedules=directory, instance_id="hung", log_dir=tmp_path,
                    stall_timeout=STALL, leader_timeout=30).start()
    blocker = set_path(pg.connect(), schema)
    try:
        wait_for(lambda: _emitted(pg, schema, after_term=0) >= 2, 30, "the leader fires")
        blocker.execute("BEGIN")
        blocker.execute("LOCK TABLE periods IN ACCESS EXCLUSIVE MODE")
        stalled = leader.wait_log(lambda r: r.get("action") == "leader_stalled", 30,
                                  "the hung leader steps down")
        assert stalled["term"] == 1  # (nothing here may read periods while it is locked)
        blocker.execute("ROLLBACK")
        wait_for(lambda: _emitted(pg, schema, after_term=1) >= 1, 30,
                 "a later term fires once the lock is gone")
        assert leader.alive()
    finally:
        blocker.close()
        assert leader.stop() == 0
