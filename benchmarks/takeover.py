"""Leader takeover after SIGKILL (SPEC §6 target: a standby leads within 250 ms).

Three `cronkeeper run` instances against a private PostgreSQL (tests/daemon_harness.py); the
leader is SIGKILLed N times. Per kill, the takeover latency is ``leadership.since`` of the new
term minus the database's clock read just before the kill (both on the database's clock, so
no VM clock is involved); the victim is restarted and rejoins as a standby before the next kill.

    .venv/bin/python benchmarks/takeover.py [--kills 20]

Prints every takeover, then the median and the worst.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from daemon_harness import (  # noqa: E402 - the harness lives with the tests
    Fleet,
    PrivatePostgres,
    db_now,
    leader_row,
    lock_sessions,
    schedule_toml,
    set_path,
    wait_for,
    wait_new_leader,
    write_schedules,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--instances", type=int, default=3)
    args = parser.parse_args()

    pg = PrivatePostgres().start()
    root = Path(tempfile.mkdtemp(prefix="cronkeeper-takeover-"))
    schedules = write_schedules(root / "schedules", {"t.toml": "\n".join([
        schedule_toml("every-second", cron="* * * * * *"),
        schedule_toml("every-5s", every="5s"),
    ])})
    fleet = Fleet(pg, pg.new_schema(), schedules, root, n=args.instances, leader_timeout=3)
    db = set_path(pg.connect(), fleet.schema)
    takeovers: list[float] = []
    try:
        fleet.start()
        for i in range(args.kills):
            def settled():
                sessions = lock_sessions(db, fleet.schema, fleet.cluster)
                row = leader_row(db, fleet.cluster)
                ok = (len(sessions) == args.instances and sum(sessions.values()) == 1 and row
                      and sessions.get(row.instance_id) is True)
                return row if ok else None
            old = wait_for(settled, 30, "one leader, every other instance waiting on the lock")
            victim = fleet.by_id(old.instance_id)
            before = db_now(db)
            victim.signal(signal.SIGKILL)
            new = wait_new_leader(db, fleet.cluster, old.term, 15, "a new leader")
            seconds = (new.since - before).total_seconds()
            takeovers.append(seconds)
            print(f"kill {i + 1:2d}: {old.instance_id} -> {new.instance_id} "
                  f"term {new.term}: {seconds * 1000:7.1f} ms", flush=True)
            victim.proc.wait(10)
            victim.start()
        dupes = db.execute("SELECT count(*) FROM (SELECT 1 FROM outbox GROUP BY schedule, "
                           "scheduled_for HAVING count(*) > 1) d").fetchone()[0]
    finally:
        fleet.shutdown()
        db.close()
        pg.stop()
    ms = sorted(t * 1000 for t in takeovers)
    print(f"\n{len(ms)} SIGKILLs of the leader, {args.instances} instances: "
          f"median {statistics.median(ms):.1f} ms, worst {ms[-1]:.1f} ms, best {ms[0]:.1f} ms "
          f"(target < 250 ms); periods with more than one job: {dupes}")


if __name__ == "__main__":
    main()
