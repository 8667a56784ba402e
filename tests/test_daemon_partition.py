"""A leader cut off from the database (not killed, not frozen): its packets stop, its sockets
stay open. Simulated on loopback by a TCP relay the test can cut and heal: the leader reaches
PostgreSQL only through it, the standbys directly. A standby must lead within the frozen-leader
bound, the cut-off leader must write nothing more, and once the network heals it must come back
as a standby, with no period doubled or lost."""

from __future__ import annotations

import contextlib
import uuid

import psycopg
import pytest
from daemon_harness import (
    Daemon,
    assert_audit_clean,
    audit,
    db_now,
    leader_row,
    lock_sessions,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    wait_new_leader,
    write_schedules,
)
from loopback_relay import Relay

LEADER_TIMEOUT = 3.0


@pytest.fixture
def setup(tmp_path):
    pg = shared_postgres()
    schema = pg.new_schema()
    schedules = write_schedules(tmp_path / "schedules", {"p.toml": "\n".join([
        schedule_toml("every-second", cron="* * * * * *"),
        schedule_toml("every-2s", every="2s", misfire="skip", grace="30s"),
    ])})
    relay = Relay(int(pg.url.rsplit(":", 1)[1].split("/")[0]))
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    via_relay = pg.url.replace(f":{relay.target_port}/", f":{relay.port}/")
    common = dict(schema=schema, cluster=cluster, schedules=schedules, log_dir=tmp_path,
                  leader_timeout=LEADER_TIMEOUT)
    leader = Daemon(url=via_relay, instance_id="cut-off", **common)
    standbys = [Daemon(url=pg.url, instance_id=f"direct{i}", **common) for i in range(2)]
    db = set_path(pg.connect(), schema)
    yield pg, db, cluster, relay, leader, standbys
    relay.heal()
    for d in (leader, *standbys):
        d.kill()
    relay.close()
    db.close()


def test_a_leader_cut_off_from_the_database_is_replaced_and_writes_nothing_more(setup):
    pg, db, cluster, relay, leader, standbys = setup
    leader.start()
    first = wait_for(lambda: (r := leader_row(db, cluster)) and r.instance_id == "cut-off" and r,
                     20, "the relayed instance to lead")
    for d in standbys:
        d.start()
    wait_for(lambda: len(lock_sessions(db, pg_schema(db), cluster)) == 3, 20, "two standbys waiting")
    wait_for(lambda: db.execute("SELECT count(*) FROM periods WHERE term = %s",
                                (first.term,)).fetchone()[0] >= 2, 10, "the first leader to fire")

    before = db_now(db)
    relay.cut()
    new = wait_new_leader(db, cluster, first.term, LEADER_TIMEOUT + 10, "a standby to lead")
    takeover = (new.since - before).total_seconds()
    print(f"\ncut-off leader replaced after {takeover:.2f} s (bound {LEADER_TIMEOUT + 2:.0f} s)")
    assert new.instance_id != "cut-off"
    assert takeover < LEADER_TIMEOUT + 2
    wait_for(lambda: db.execute("SELECT count(*) FROM periods WHERE term = %s",
                                (new.term,)).fetchone()[0] >= 3, 10, "the new leader to fire")
    old_rows = db.execute("SELECT count(*) FROM periods WHERE term = %s", (first.term,)).fetchone()[0]

    relay.heal()  # whatever the cut-off leader queued now reaches a terminated session
    wait_for(lambda: lock_sessions(db, pg_schema(db), cluster).get("cut-off") is False, 30,
             "the healed instance to wait on the lock as a standby")
    assert db.execute("SELECT count(*) FROM periods WHERE term = %s",
                      (first.term,)).fetchone()[0] == old_rows
    assert db.execute("SELECT count(*) FROM periods WHERE term = %s AND decided_at >= %s",
                      (first.term, new.since)).fetchone()[0] == 0
    assert leader_row(db, cluster).term == new.term
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not audit(db, margin=2.0).missing, 20, "every due period decided")
    assert_audit_clean(db, margin=2.0, context="after a partition of the leader")


def pg_schema(db: psycopg.Connection) -> str:
    return db.execute("SELECT current_schema()").fetchone()[0]
