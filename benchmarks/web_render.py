"""Server time of `cronkeeper web`'s schedules page with 10,000 schedules and 48-period strips
(issue 12 target: under 1 s).

Creates a fresh schema holding 10,000 schedules (a mix of every 60 s, every 5 min, hourly and
daily crons, a fifth of them in America/New_York), each with the 60 latest periods recorded
(every 13th skipped for overlap, every 29th left unrecorded so it shows as missing) and a job
per emitted period (every 31st dead): 600,000 periods and about 550,000 jobs, seeded in SQL.
Then it renders the page through the real WSGI application in this process (no network: the
server's own time, database reads included) and prints the best and median of the runs for:

- the default page (the first 100 schedules, sorted by name), cold (the first request parses
  the 10,000 stored specs) and warm;
- ``state=missing``: the filter that audits every schedule's strip, then shows one page;
- ``state=dead``: a filter on a recorded state, where one statement first narrows the
  schedules to those with such a record in their window;
- ``owner=``: a filter on the parsed specs;
- with ``--all-on-one-page``, ``per_page=10000``: all 10,000 rows and 480,000 strip cells in
  one document, once (it is why the page is paged: no browser wants that document either).

It also prints the plans (EXPLAIN) of the statements the page runs, to name the indexes.
No peer is run side by side: none of the dashboards this page stands beside (Oban Web,
Sidekiq's Web UI, Hangfire) can run against cronkeeper's tables.

    .venv/bin/python benchmarks/web_render.py [--runs 3] [--schedules 10000]
        [--database-url postgresql://postgres@127.0.0.1:5432/test] [--keep] [--all-on-one-page]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid

import psycopg

from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import migrate
from cronkeeper.spec.model import Misfire, ScheduleSpec

KINDS = [  # (every, cron, zone, period seconds)
    (60.0, None, "UTC", 60), (300.0, None, "UTC", 300), (None, "7 * * * *", "UTC", 3600),
    (None, "30 4 * * *", "UTC", 86400), (None, "15 * * * *", "America/New_York", 3600),
]

SEED_PERIODS = """
WITH s AS (
    SELECT v.id, v.schedule, (v.spec->>'period')::int AS period
    FROM schedule_versions v
), last AS (
    SELECT s.*, to_timestamp(floor(extract(epoch FROM now()) / period) * period) AS top
    FROM s
)
INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, decided_at, term)
SELECT schedule, top - make_interval(secs => period * k), id,
       CASE WHEN (id + k) % 13 = 0 THEN 'skipped' ELSE 'emitted' END,
       CASE WHEN (id + k) % 13 = 0 THEN 'overlap' END,
       top - make_interval(secs => period * k) + interval '0.3 seconds', 1
FROM last, generate_series(1, 60) AS k
WHERE (id + k) % 29 <> 0
"""

SEED_JOBS = """
INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, state, attempts,
                    created_at, run_after, finished_at)
SELECT schedule || '@' || to_char(scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       schedule, scheduled_for, version_id, 'bench.noop',
       CASE WHEN extract(epoch FROM scheduled_for)::bigint % 31 = 0 THEN 'dead' ELSE 'succeeded' END,
       1, scheduled_for + interval '0.3 seconds', scheduled_for, scheduled_for + interval '1 second'
FROM periods WHERE outcome = 'emitted'
"""


def seed(url: str, schema: str, count: int) -> None:
    admin = make_engine(normalize_url(url), "public", pool_size=1)
    migrate(admin, schema)
    admin.dispose()
    rows = []
    for i in range(count):
        every, cron, zone, period = KINDS[i % len(KINDS)]
        name = f"job-{i:05d}"
        spec = ScheduleSpec(name=name, every=every, cron=cron, timezone=zone,
                            misfire=Misfire.SKIP, task="bench.noop", owner=f"team-{i % 7}")
        doc = spec.to_json()
        rows.append((name, spec.digest, json.dumps(doc), period))
    with psycopg.connect(url, options=f"-c search_path={schema}") as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
                "VALUES (%s, %s, %s::jsonb || jsonb_build_object('period', %s::int), "
                "now() - interval '400 days', 1)", rows)
        conn.execute(SEED_PERIODS)
        conn.execute(SEED_JOBS)
        conn.execute("UPDATE schedule_versions SET spec = spec - 'period'")
        conn.commit()
        conn.execute("ANALYZE")


def explain(url: str, schema: str) -> None:
    from cronkeeper.db import dashboard

    with psycopg.connect(url, options=f"-c search_path={schema}") as conn:
        names = [r[0] for r in conn.execute(
            "SELECT DISTINCT schedule FROM schedule_versions ORDER BY 1 LIMIT 100")]
        plans = {
            "periods_windows (one page, 100 schedules)": (
                "EXPLAIN " + dashboard.PERIODS_WINDOWS,
                {"names": names, "sinces": [None] * len(names), "until": None}),
        }
        for title, (sql, params) in plans.items():
            params["sinces"] = [conn.execute("SELECT now() - interval '3 days'").fetchone()[0]
                                ] * len(names)
            params["until"] = conn.execute("SELECT now()").fetchone()[0]
            print(f"\nEXPLAIN {title}:")
            for (line,) in conn.execute(sql, params):
                print("   ", line)
        for title, sql in (
            ("periods_latest (lateral, per schedule)",
             "EXPLAIN SELECT s, p.scheduled_for FROM unnest(%s::text[]) AS s CROSS JOIN LATERAL "
             "(SELECT * FROM periods WHERE schedule = s ORDER BY scheduled_for DESC LIMIT 1) p"),
        ):
            print(f"\nEXPLAIN {title}:")
            for (line,) in conn.execute(sql, (names,)):
                print("   ", line)


def timed(client, path: str, runs: int) -> tuple[float, float, int]:
    took = []
    size = 0
    for _ in range(runs):
        start = time.perf_counter()
        resp = client.get(path, headers={"Host": "127.0.0.1"})
        took.append(time.perf_counter() - start)
        assert resp.status_code == 200, resp.get_data(as_text=True)[:500]
        size = len(resp.get_data())
    return min(took), statistics.median(took), size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--keep", action="store_true", help="Keep the schema afterwards.")
    parser.add_argument("--all-on-one-page", action="store_true",
                        help="Also render all schedules in one document (minutes, 150 MB).")
    args = parser.parse_args()
    schema = f"bench_web_{uuid.uuid4().hex[:8]}"
    start = time.perf_counter()
    seed(args.database_url, schema, args.schedules)
    print(f"seeded {args.schedules} schedules in schema {schema} in "
          f"{time.perf_counter() - start:.1f}s")
    from cronkeeper.db.engine import redact
    from cronkeeper.web.app import Context, wsgi
    from cronkeeper.web.pages import VersionsCache
    from cronkeeper.web.security import WebConfig

    engine = make_engine(normalize_url(args.database_url), schema)
    try:
        app = wsgi(Context(engine, schema, "default", redact(normalize_url(args.database_url)),
                           WebConfig.make("127.0.0.1", 9480, None, False), VersionsCache()))
        client = app.test_client()
        cold = timed(client, "/", 1)
        print(f"\nschedules page, first 100 rows, cold (parses {args.schedules} specs): "
              f"{cold[0]:.3f}s ({cold[2] / 1e3:.0f} kB)")
        for label, path, runs in (
            ("schedules page, first 100 rows, warm", "/", args.runs),
            ("schedules page, page 50 of 100, warm", "/?page=50", args.runs),
            ("schedules page, state=missing (audits every strip)", "/?state=missing", args.runs),
            ("schedules page, state=dead (SQL narrows, the audit decides)", "/?state=dead",
             args.runs),
            ("schedules page, owner=team-3 (1 in 7)", "/?owner=team-3", args.runs),
            (f"schedules page, all {args.schedules} rows on one page", "/?per_page=10000",
             1 if args.all_on_one_page else 0),
        ):
            if runs == 0:
                continue
            best, median, size = timed(client, path, runs)
            print(f"{label}: best {best:.3f}s, median {median:.3f}s over {runs} runs "
                  f"({size / 1e6:.1f} MB)")
        explain(args.database_url, schema)
    finally:
        engine.dispose()
        if not args.keep:
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()
