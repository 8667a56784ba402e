"""What noting recoveries costs the worker's hot statement: ``outbox_complete`` of a batch of
jobs with ``note=True`` (the completion also looks up each job's schedule in
notification_subjects and ends a dead one: docs/notifications.md) against ``note=False`` (the
statement as it was), alternating rounds in one run, on the same database.

    .venv/bin/python benchmarks/notify_noting_cost.py --rounds 40 --batch 200 \\
        --database-url postgresql://postgres@127.0.0.1:5432/test

Two states of notification_subjects: empty (no schedule ever died), and 10,000 subjects that
died once and recovered (dead_letters 0), among them every schedule of the batches: the lookup
then finds a row for each job and leaves it alone, the steady state of a large fleet. Each
round claims a batch (not timed) and times the completion statement alone. Prints the median
microseconds per job of each, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg

SCHEMA = "bench_noting"


def plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def main() -> None:
    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.db.migrate import migrate
    from cronkeeper.db.outbox_claims import outbox_claim
    from cronkeeper.db.outbox_endings import outbox_complete

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per variant and state")
    parser.add_argument("--batch", type=int, default=200, help="jobs per completion")
    parser.add_argument("--schedules", type=int, default=1000, help="distinct schedules of the jobs")
    args = parser.parse_args()
    url = plain(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
    admin = make_engine(normalize_url(args.database_url), "public", pool_size=1)
    migrate(admin, SCHEMA)
    admin.dispose()
    engine = make_engine(normalize_url(args.database_url), SCHEMA, pool_size=1)
    total = args.rounds * 4 * args.batch
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox (idempotency_key, schedule, task) SELECT 'k' || g, "
            "'s' || (g %% %(s)s), 'bench.noop' FROM generate_series(1, %(n)s) g",
            {"s": args.schedules, "n": total})
        conn.exec_driver_sql("ANALYZE outbox")
    results: dict[tuple[str, bool], list[float]] = {}
    try:
        for state in ("empty", "10,000 recovered"):
            if state != "empty":
                with engine.begin() as conn:
                    conn.exec_driver_sql(
                        "INSERT INTO notification_subjects (kind, name, dead_letters) "
                        "SELECT 'schedule', 's' || g, 0 FROM generate_series(0, 9999) g")
                    conn.exec_driver_sql("ANALYZE notification_subjects")
            for n in range(2 * args.rounds):
                note = n % 2 == 1
                with engine.begin() as conn:
                    jobs = outbox_claim(conn, worker_id="bench", limit=args.batch,
                                        lease_margin=30)
                with engine.begin() as conn:
                    started = time.perf_counter()
                    outbox_complete(conn, worker_id="bench", ids=[j.id for j in jobs],
                                    attempts=[j.attempt for j in jobs], note=note)
                    elapsed = time.perf_counter() - started
                results.setdefault((state, note), []).append(elapsed / len(jobs) * 1e6)
        print(f"outbox_complete, batches of {args.batch} jobs of {args.schedules} schedules, "
              f"{args.rounds} rounds each, alternating")
        for state in ("empty", "10,000 recovered"):
            off = statistics.median(results[(state, False)])
            on = statistics.median(results[(state, True)])
            print(f"  subjects {state:>16}: note=False {off:6.1f} us/job   note=True {on:6.1f} "
                  f"us/job   ratio {on / off:.2f}")
    finally:
        engine.dispose()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')


if __name__ == "__main__":
    main()
