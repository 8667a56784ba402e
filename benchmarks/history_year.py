"""How long `cronkeeper history` takes on a year of a minutely schedule (525,600 periods; §9
target: < 5 s end to end).

Creates a fresh schema, records one version of a minutely schedule active since 366 days ago,
seeds a year of period outcomes in one statement (every 97th skipped for overlap, a few deleted
to show as missing) and 14 days of jobs (what retention keeps), then runs the real console
script as a subprocess, Python start-up included, and prints the best and median of the runs.

    .venv/bin/python benchmarks/history_year.py [--runs 3] [--format json|table]
        [--database-url postgresql://postgres@127.0.0.1:5432/test]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import migrate
from cronkeeper.schedule.model import Misfire, ScheduleSpec

SEED = """
WITH v AS (
    INSERT INTO schedule_versions (schedule, digest, spec, active_from, term)
    VALUES ('minutely', :digest, CAST(:spec AS jsonb),
            date_trunc('minute', now()) - interval '366 days' + interval '1 second', 1)
    RETURNING id, active_from
), p AS (
    INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, decided_at, term)
    SELECT 'minutely', t, v.id,
           CASE WHEN n % 97 = 0 THEN 'skipped' ELSE 'emitted' END,
           CASE WHEN n % 97 = 0 THEN 'overlap' END,
           t + interval '0.2 seconds', 1
    FROM v, generate_series(date_trunc('minute', now()) - interval '366 days' + interval '1 minute',
                            date_trunc('minute', now()) - interval '2 minutes',
                            interval '1 minute') WITH ORDINALITY AS g(t, n)
    WHERE n % 100003 <> 0
    RETURNING scheduled_for, outcome, version_id
)
INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, state, attempts,
                    created_at, run_after, finished_at)
SELECT 'minutely@' || to_char(scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       'minutely', scheduled_for, version_id, 'bench.noop', 'succeeded', 1,
       scheduled_for + interval '0.2 seconds', scheduled_for, scheduled_for + interval '1 second'
FROM p WHERE outcome = 'emitted' AND scheduled_for > now() - interval '14 days'
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--format", default="json", choices=["json", "table"])
    parser.add_argument("--database-url", default=os.environ.get(
        "CRONKEEPER_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    url = normalize_url(args.database_url)
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    engine = make_engine(url, schema)
    migrate(engine, schema)
    spec = ScheduleSpec(name="minutely", cron="* * * * *", timezone="UTC", misfire=Misfire.SKIP,
                        task="bench.noop", owner="bench")
    try:
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(sa.text(SEED), {"digest": spec.digest, "spec": json.dumps(spec.to_json())})
            periods = conn.execute(sa.text("SELECT count(*) FROM periods")).scalar_one()
            conn.exec_driver_sql("ANALYZE periods; ANALYZE outbox")
        print(f"seeded {periods} periods in {time.perf_counter() - started:.1f}s")
        exe = str(Path(sys.executable).with_name("cronkeeper"))
        argv = [exe, "history", "--database-url", args.database_url, "--schema", schema,
                "--since", "365d", "--format", args.format]
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            proc = subprocess.run(argv, capture_output=True, text=True)
            times.append(time.perf_counter() - started)
            if proc.returncode not in (0, 1):
                sys.exit(f"history failed ({proc.returncode}): {proc.stderr}")
        rows = len(json.loads(proc.stdout)["periods"]) if args.format == "json" else None
        print(f"history --since 365d --format {args.format}: {rows or ''} rows, "
              f"best {min(times):.2f}s, median {statistics.median(times):.2f}s "
              f"over {args.runs} runs (target < 5 s); exit {proc.returncode} "
              f"({proc.stderr.strip()})")
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        engine.dispose()


if __name__ == "__main__":
    main()
