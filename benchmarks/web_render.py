"""Server time of `cronkeeper web`'s schedules page with 10,000 schedules and 48-period strips
(issue 12 target: under 1 s).

Creates a fresh schema holding 10,000 schedules of a realistic mix: `every` intervals from
1 min to 1 h, hourly crons at every minute of the hour, `*/K` steps, daily and weekday-only
crons at many local times, in twelve timezones (half- and quarter-hour offsets, both
hemispheres' DST): thousands of distinct triggers, no two schedules sharing a stored version,
so no cache is flattered by identical crons. Each schedule's 60 latest fires (computed by its
own trigger) are recorded, every 13th skipped for overlap and every 29th left unrecorded (it
shows as missing), with a job per emitted period (every 31st dead): 600,000 periods and about
550,000 jobs. Then it renders the page through the real WSGI application in this process (no
network: the server's own time, database reads included) and prints, for each page, the
**cold** time (a fresh application whose cache holds nothing: the first request parses the
10,000 stored specs and computes their expected fires) and the **warm** time (best and
median of ``--runs`` requests after it, and the least CPU time this process spent on one: the
server's own work, which a loaded machine does not inflate), with the load average beside
them:

- the default page (the first 100 schedules, sorted by name) and page 50;
- ``state=missing``, ``state=dead``, ``state=skipped``, ``state=running``, ``state=pending``:
  filters that judge every schedule's last 48 periods, then draw one page;
- ``owner=``: a filter on the parsed specs;
- ``per_page=1000``: the largest page the server shows (``routes.MAX_PER_PAGE``);
- with ``--all-on-one-page``, all 10,000 rows and 480,000 strip cells in one document (cold
  once, warm once), the page limit lifted for the measurement.

It also prints how long ``cronkeeper web`` spends at start warming its cache
(``VersionsCache.warm``), and the plans (EXPLAIN) of the statements the page runs, to name
the indexes. No peer is run side by side: none of the dashboards this page stands beside
(Oban Web, Sidekiq's Web UI, Hangfire) can run against cronkeeper's tables.

    .venv/bin/python benchmarks/web_render.py [--runs 3] [--schedules 10000]
        [--database-url postgresql://postgres@127.0.0.1:5432/test] [--keep] [--schema NAME]
        [--all-on-one-page]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import resource
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg

from cronkeeper.audit import fire_seconds
from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import migrate
from cronkeeper.schedule.model import Misfire, ScheduleSpec

ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Asia/Tokyo", "Australia/Sydney",
         "America/Los_Angeles", "Asia/Kolkata", "Europe/London", "America/Sao_Paulo",
         "Asia/Kathmandu", "Pacific/Auckland", "Africa/Cairo"]
EVERY = [60, 120, 300, 600, 900, 1800, 3600]
STEPS = [2, 3, 5, 10, 15, 20, 30]


def kind(i: int) -> tuple[float | None, str | None, str, float]:
    """(every, cron, zone, a nominal period) of the i-th schedule: a spread of triggers."""
    zone = ZONES[(i // 7) % len(ZONES)]
    minute, hour = (i * 7) % 60, (i * 5) % 24
    match i % 7:
        case 0:
            return float(EVERY[(i // 7) % len(EVERY)]), None, zone, EVERY[(i // 7) % len(EVERY)]
        case 1 | 2:
            return None, f"{minute} * * * *", zone, 3600
        case 3:
            step = STEPS[(i // 7) % len(STEPS)]
            return None, f"{minute % step}-59/{step} * * * *", zone, step * 60
        case 4:
            return None, f"{minute} {hour} * * *", zone, 86400
        case 5:
            return None, f"{minute} {hour % 12}-23/2 * * 1-5", zone, 7200
        case _:
            return None, f"{minute} {hour} * * 1-5", zone, 86400


SEED_JOBS = """
INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, state, attempts,
                    created_at, run_after, finished_at)
SELECT schedule || '@' || to_char(scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
       schedule, scheduled_for, version_id, 'bench.noop',
       CASE WHEN extract(epoch FROM scheduled_for)::bigint % 31 = 0 THEN 'dead' ELSE 'succeeded' END,
       1, scheduled_for + interval '0.3 seconds', scheduled_for, scheduled_for + interval '1 second'
FROM periods WHERE outcome = 'emitted'
"""


def seed(url: str, schema: str, count: int) -> int:
    """The schedules, their 60 latest periods and jobs; returns the distinct triggers."""
    admin = make_engine(normalize_url(url), "public", pool_size=1)
    migrate(admin, schema)
    admin.dispose()
    with psycopg.connect(url, options=f"-c search_path={schema}") as conn:
        now = conn.execute("SELECT now()").fetchone()[0]
        specs, rows = [], []
        for i in range(count):
            every, cron, zone, _ = kind(i)
            spec = ScheduleSpec(name=f"job-{i:05d}", every=every, cron=cron, timezone=zone,
                                misfire=Misfire.SKIP, task="bench.noop", owner=f"team-{i % 7}")
            specs.append(spec)
            rows.append((spec.name, spec.digest, json.dumps(spec.to_json())))
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
                "VALUES (%s, %s, %s::jsonb, now() - interval '400 days', 1)", rows)
        ids = dict(conn.execute("SELECT schedule, id FROM schedule_versions"))
        out = io.StringIO()
        for i, spec in enumerate(specs):
            period = kind(i)[3]
            fires = list(fire_seconds(spec.trigger(), now - timedelta(seconds=period * 130),
                                      now))[-60:]
            vid = ids[spec.name]
            for k, at in enumerate(reversed(fires), start=1):
                if (vid + k) % 29 == 0:
                    continue
                when = datetime.fromtimestamp(at, UTC)
                skipped = (vid + k) % 13 == 0
                out.write(f"{spec.name}\t{when.isoformat()}\t{vid}\t"
                          f"{'skipped' if skipped else 'emitted'}\t"
                          f"{'overlap' if skipped else chr(92) + 'N'}\t"
                          f"{(when + timedelta(seconds=0.3)).isoformat()}\t1\n")
        with conn.cursor() as cur, cur.copy(
                "COPY periods (schedule, scheduled_for, version_id, outcome, reason, decided_at, "
                "term) FROM STDIN") as copy:
            copy.write(out.getvalue())
        conn.execute(SEED_JOBS)
        conn.commit()
        conn.autocommit = True  # as autovacuum leaves a table that has settled: visibility
        conn.execute("VACUUM (ANALYZE) periods, outbox, schedule_versions")  # map set
    return len({(s.cron, s.every, s.timezone) for s in specs})


def explain(url: str, schema: str) -> None:
    from cronkeeper.db import periods

    # jit off, as the page's transaction has it (``sessions.session_snapshot``)
    with psycopg.connect(url, options=f"-c search_path={schema} -c jit=off") as conn:
        every = [r[0] for r in conn.execute(
            "SELECT DISTINCT schedule FROM schedule_versions ORDER BY 1")]
        names = every[:100]
        since, until = conn.execute("SELECT now() - interval '3 days', now()").fetchone()
        plans = {  # (statement, the schedules it is asked about)
            "periods_windows (one page, 100 schedules)": (periods.PERIODS_WINDOWS, names),
            "periods_window_states (a state filter, every schedule)": (
                periods.PERIODS_WINDOW_STATES, every),
            "periods_window_states, instants only (state=missing/pending)": (
                periods.PERIODS_WINDOW_INSTANTS, every),
            "periods_window_states, dead and running jobs (state=dead/running/emitted)": (
                periods.JOBS_WINDOW_DEAD_RUNNING, every),
        }
        for title, (sql, asked) in plans.items():
            print(f"\nEXPLAIN {title}:")
            params = {"names": asked, "sinces": [since] * len(asked), "until": until}
            for (line,) in conn.execute("EXPLAIN " + sql, params):
                print("   ", line)
        for title, sql in (
            ("periods_latest (lateral, per schedule)",
             "EXPLAIN SELECT s, p.scheduled_for FROM unnest(%s::text[]) AS s CROSS JOIN LATERAL "
             "(SELECT * FROM periods WHERE schedule = s ORDER BY scheduled_for DESC LIMIT 1) p"),
        ):
            print(f"\nEXPLAIN {title}:")
            for (line,) in conn.execute(sql, (names,)):
                print("   ", line)


def cpu() -> float:
    """This process's CPU seconds (user + system): the server's own work, without the
    database's and without waiting for a CPU on a loaded machine."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(client, path: str, runs: int) -> tuple[float, float, int, float]:
    """(best wall, median wall, size, least CPU of this process) over ``runs`` requests."""
    took, cpus = [], []
    size = 0
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), cpu()
        resp = client.get(path, headers={"Host": "127.0.0.1"})
        took.append(time.perf_counter() - start)
        cpus.append(cpu() - start_cpu)
        assert resp.status_code == 200, resp.get_data(as_text=True)[:500]
        size = len(resp.get_data())
    return min(took), statistics.median(took), size, min(cpus)


def load() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--keep", action="store_true", help="Keep the schema afterwards.")
    parser.add_argument("--schema", help="Reuse a schema kept by an earlier run (no seeding).")
    parser.add_argument("--all-on-one-page", action="store_true",
                        help="Also render all schedules in one document (minutes, 100+ MB).")
    args = parser.parse_args()
    from cronkeeper.db.engine import redact
    from cronkeeper.web import routes
    from cronkeeper.web.app import Context, wsgi
    from cronkeeper.web.pages import VersionsCache
    from cronkeeper.web.security import WebConfig

    schema = args.schema or f"bench_web_{uuid.uuid4().hex[:8]}"
    if not args.schema:
        start = time.perf_counter()
        distinct = seed(args.database_url, schema, args.schedules)
        print(f"seeded {args.schedules} schedules ({distinct} distinct cron/every + timezone) "
              f"in schema {schema} in {time.perf_counter() - start:.1f}s")

    engine = make_engine(normalize_url(args.database_url), schema)

    def client(warm: bool):
        cache = VersionsCache()
        if warm:
            cache.warm(engine)
            gc.collect()  # as cronkeeper web does after warming
            gc.freeze()
        return wsgi(Context(engine, schema, "default", redact(normalize_url(args.database_url)),
                            WebConfig.make("127.0.0.1", 9480, None, False), cache)).test_client()

    try:
        print(load())
        start = time.perf_counter()
        client(True)
        print(f"start-up warm-up of the cache (cronkeeper web does it before serving): "
              f"{time.perf_counter() - start:.3f}s")
        pages = [
            ("first 100 rows", "/", args.runs),
            ("page 50 of 100", "/?page=50", args.runs),
            ("state=missing", "/?state=missing", args.runs),
            ("state=dead", "/?state=dead", args.runs),
            ("state=skipped", "/?state=skipped", args.runs),
            ("state=running (none here)", "/?state=running", args.runs),
            ("state=pending", "/?state=pending", args.runs),
            ("owner=team-3 (1 in 7)", "/?owner=team-3", args.runs),
        ]
        pages.append(("1,000 rows (the most a page shows)", "/?per_page=1000", args.runs))
        if args.all_on_one_page:  # past what the page allows: lifted here to measure the cost
            routes.MAX_PER_PAGE = max(routes.MAX_PER_PAGE, args.schedules)
            pages.append((f"all {args.schedules} rows on one page",
                          f"/?per_page={args.schedules}", 1))
        for label, path, runs in pages:
            cold = timed(client(False), path, 1)
            timed(warmed := client(True), path, 1)  # fills the fire cache
            best, median, size, least = timed(warmed, path, runs)
            print(f"{label:<34} cold {cold[0]:7.3f}s | warm best {best:7.3f}s, median "
                  f"{median:7.3f}s over {runs} (CPU here {least:6.3f}s) | {size / 1e6:6.1f} MB "
                  f"| {load()}")
        explain(args.database_url, schema)
    finally:
        engine.dispose()
        if not args.keep and not args.schema:
            with psycopg.connect(args.database_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()
