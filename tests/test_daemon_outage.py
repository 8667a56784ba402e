"""Every instance down for a while, then back (SPEC §1 "nothing vanishes silently", §6 misfire
policies): each period missed during the outage is emitted or recorded as skipped, as its
schedule's policy says, and none is absent."""

from __future__ import annotations

import signal
from datetime import timedelta

from daemon_harness import (
    Fleet,
    assert_audit_clean,
    audit,
    db_now,
    leader_row,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    wait_new_leader,
    write_schedules,
)

OUTAGE = 10.0  # seconds with no instance running
TOLERANCE = 0.3  # seconds around a policy's boundary (decision time vs. recorded decided_at)
SCHEDULES = {
    "outage.toml": "\n".join([
        schedule_toml("catch-all", every="1s", misfire="catch_up", catch_up_limit="1h"),
        schedule_toml("catch-recent", every="1s", misfire="catch_up", catch_up_limit="4s"),
        schedule_toml("skip-late", every="1s", misfire="skip", grace="1s"),
        schedule_toml("latest-only", every="2s", misfire="latest", grace="1s"),
    ]),
}
NAMES = ("catch-all", "catch-recent", "skip-late", "latest-only")


def test_outage_of_every_instance_each_missed_period_decided_by_policy(tmp_path):
    pg = shared_postgres()
    schedules = write_schedules(tmp_path / "schedules", SCHEDULES)
    fleet = Fleet(pg, pg.new_schema(), schedules, tmp_path, n=2, leader_timeout=3)
    db = set_path(pg.connect(), fleet.schema)
    try:
        fleet.start()
        wait_for(lambda: db.execute("SELECT count(DISTINCT schedule) FROM periods").fetchone()[0]
                 == len(NAMES), 20, "every schedule to fire before the outage")
        first = leader_row(db, fleet.cluster)
        for d in fleet.daemons:  # graceful: each releases the lock (a standby may lead briefly)
            d.terminate()
        for d in fleet.daemons:
            assert d.stop(15) == 0, d.log_text()[-2000:]
        down = db_now(db)
        last_before = dict(db.execute(
            "SELECT schedule, max(scheduled_for) FROM periods GROUP BY 1").fetchall())
        # the outage itself: a chosen duration, not a wait for a race
        wait_for(lambda: (db_now(db) - down).total_seconds() >= OUTAGE, OUTAGE + 5, "the outage")
        term_before = leader_row(db, fleet.cluster).term
        fleet.start()
        new = wait_new_leader(db, fleet.cluster, term_before, 20, "a leader after the outage")
        assert new.term > first.term
        wait_for(lambda: not audit(db, margin=1.5).missing, 20, "every due period decided",
                 interval=0.2)
        assert_audit_clean(db, margin=1.5, context="after the outage")

        rows = db.execute(
            """SELECT schedule, scheduled_for, outcome, reason,
                      extract(epoch FROM decided_at - scheduled_for)::float8 AS late
               FROM periods WHERE term = %s ORDER BY schedule, scheduled_for""",
            (new.term,)).fetchall()
        missed: dict[str, list[tuple]] = {n: [] for n in NAMES}
        for schedule, scheduled_for, outcome, reason, late in rows:
            if scheduled_for > last_before[schedule] and scheduled_for < new.since:
                missed[schedule].append((scheduled_for, outcome, reason, late))
        for name in NAMES:  # nothing between the last period before and the first after is absent
            gap = [p for p, *_ in missed[name]]
            step = 2 if name == "latest-only" else 1
            expected = int((new.since - last_before[name]).total_seconds() // step)
            assert len(gap) == expected, (name, len(gap), expected)
            assert all(b - a == timedelta(seconds=step) for a, b in zip(gap, gap[1:], strict=False))
            assert len(gap) >= OUTAGE / step - 1, (name, len(gap))

        # catch_up with a long limit: every missed period emitted, oldest first
        assert all(o == "emitted" for _, o, _, _ in missed["catch-all"]), missed["catch-all"]
        # catch_up with a 4 s limit: late beyond it -> skipped (misfire); within it -> emitted
        for p, outcome, reason, late in missed["catch-recent"]:
            if late > 4 + TOLERANCE:
                assert (outcome, reason) == ("skipped", "misfire"), (p, late)
            elif late < 4 - TOLERANCE:
                assert outcome == "emitted", (p, late)
        assert sum(o == "skipped" for _, o, _, _ in missed["catch-recent"]) >= OUTAGE - 6
        # skip with 1 s grace: every period more than 1 s late is skipped (misfire)
        for p, outcome, reason, late in missed["skip-late"]:
            if late > 1 + TOLERANCE:
                assert (outcome, reason) == ("skipped", "misfire"), (p, late)
            elif late < 1 - TOLERANCE:
                assert outcome == "emitted", (p, late)
        assert sum(o == "skipped" for _, o, _, _ in missed["skip-late"]) >= OUTAGE - 3
        # latest with 1 s grace: of the late periods at most the newest is emitted, the others
        # are coalesced; and the outage ends in exactly one emitted period (late or on time)
        late_ones = [m for m in missed["latest-only"] if m[3] > 1 + TOLERANCE]
        emitted_late = [m for m in late_ones if m[1] == "emitted"]
        assert len(emitted_late) <= 1
        if emitted_late:
            assert emitted_late[0] == late_ones[-1]
        assert all((o, r) == ("skipped", "coalesced") for _, o, r, _ in late_ones[:-1])
        batch = db.execute(
            """SELECT outcome, extract(epoch FROM decided_at - scheduled_for)::float8
               FROM periods WHERE schedule = 'latest-only' AND term = %s AND decided_at = (
                   SELECT min(decided_at) FROM periods WHERE schedule = 'latest-only' AND term = %s)
               ORDER BY scheduled_for""", (new.term, new.term)).fetchall()
        assert len(batch) >= OUTAGE / 2 - 1  # the whole outage was decided at once
        emitted = [late for outcome, late in batch if outcome == "emitted"]
        assert emitted, batch  # the outage ends in one fire: the newest late period or on time
        assert sum(late > 1 + TOLERANCE for late in emitted) <= 1, batch
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{fleet.logs()}") from None
    finally:
        fleet.shutdown()
        db.close()


def test_crash_restarts_never_redecide_a_period(tmp_path):
    """A second start over the same history re-decides nothing: the unique claim holds."""
    pg = shared_postgres()
    schedules = write_schedules(tmp_path / "schedules", {
        "one.toml": schedule_toml("again", every="1s", misfire="catch_up", catch_up_limit="1h")})
    fleet = Fleet(pg, pg.new_schema(), schedules, tmp_path, n=1, leader_timeout=3)
    db = set_path(pg.connect(), fleet.schema)
    try:
        for term in (1, 2):
            fleet.start()
            wait_for(lambda t=term: db.execute("SELECT count(*) FROM periods WHERE term = %s",
                                              (t,)).fetchone()[0] >= 2, 20, "periods decided")
            fleet.daemons[0].signal(signal.SIGKILL)  # no graceful release: a crash
            fleet.daemons[0].proc.wait(10)
        fleet.start()
        wait_for(lambda: db.execute("SELECT count(*) FROM periods WHERE term = 3").fetchone()[0],
                 20, "the third term to fire")
        assert_audit_clean(db, margin=1.5, context="three crashes")
    finally:
        fleet.shutdown()
        db.close()
