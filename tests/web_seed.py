"""A database with a known story, for the web's tests: the strip of ``alpha`` reads, in order,
emitted, skipped (overlap), missing, dead, skipped (paused), [version change], running,
missing; ``dst-nightly`` fired through the last DST gap of America/New_York; instances with a
stale one, no leader and disagreeing digests; dead letters; text that holds markup.

Also a helper that starts ``cronkeeper web`` as a real process and finds its port."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg

from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import migrate
from cronkeeper.schedule.model import Misfire, ScheduleSpec

CRONKEEPER = str(Path(sys.executable).with_name("cronkeeper"))
XSS = "<script>alert('x')</script>"
NY = ZoneInfo("America/New_York")


def spec(name: str, *, every: float | None = None, cron: str | None = None, tz: str = "UTC",
         grace: float = 10, owner: str | None = "team-a", description: str | None = None,
         task: str = "t.x") -> ScheduleSpec:
    return ScheduleSpec(name=name, every=every, cron=cron, timezone=tz, misfire=Misfire.SKIP,
                        task=task, grace=grace, owner=owner, description=description)


def last_gap_day(now: datetime) -> datetime:
    """Noon (New York) of the last day, before ``now``, on which New York's clocks sprang
    forward (the second Sunday of March)."""
    year = now.year if now.astimezone(NY) > datetime(now.year, 3, 16, tzinfo=NY) else now.year - 1
    day = datetime(year, 3, 8, 12, tzinfo=NY)
    while day.weekday() != 6:  # Sunday
        day += timedelta(days=1)
    return day


@dataclass
class Seeded:
    url: str
    schema: str
    cluster: str
    now: datetime
    base: datetime
    gap_day: datetime
    dead_ids: list[int]

    def m(self, n: int) -> datetime:
        return self.base + timedelta(minutes=n)


class Seeder:
    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def version(self, s: ScheduleSpec | None, name: str, active_from: datetime) -> int:
        return self.conn.execute(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
            "VALUES (%s, %s, %s::jsonb, %s, 1) RETURNING id",
            (name, s.digest if s else "removed", json.dumps(s.to_json()) if s else None,
             active_from)).fetchone()[0]

    def period(self, name: str, version: int, when: datetime, outcome: str,
               reason: str | None = None, job: tuple | None = None, task: str = "t.x") -> int | None:
        self.conn.execute(
            "INSERT INTO periods (schedule, scheduled_for, version_id, outcome, reason, "
            "decided_at, term) VALUES (%s, %s, %s, %s, %s, %s, 1)",
            (name, when, version, outcome, reason, when + timedelta(seconds=0.5)))
        if job is None:
            return None
        state, attempts, error = (*job, None)[:3]
        key = f"{name}@{when.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"
        return self.job(key, name, when, version, state, attempts, error, task)

    def job(self, key, name, when, version, state, attempts, error=None, task="t.x") -> int:
        at = when or self.now()
        finished = at + timedelta(seconds=5) if state in ("succeeded", "dead") else None
        return self.conn.execute(
            "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, "
            "state, attempts, created_at, run_after, owner, last_error, finished_at) VALUES "
            "(%s, %s, %s, %s, %s, %s, %s, %s, %s, 'team-a', %s, %s) RETURNING id",
            (key, name, when, version, task, state, attempts, at + timedelta(seconds=0.5), at,
             error, finished)).fetchone()[0]

    def attempt(self, job_id: int, n: int, outcome: str, error: str | None, at: datetime) -> None:
        self.conn.execute(
            "INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at, outcome, "
            "error) VALUES (%s, %s, 'w-1', %s, %s, %s, %s)",
            (job_id, n, at, at + timedelta(seconds=1), outcome, error))

    def instance(self, cluster, iid, *, digest, age, kind="scheduler", role="standby",
                 tz="2025b") -> None:
        self.conn.execute(
            "INSERT INTO instances (cluster, instance_id, kind, host, pid, version, "
            "schedules_digest, tzdata_version, role, started_at, heartbeat_at) VALUES "
            "(%s, %s, %s, 'host-1', 4242, '0.1.0', %s, %s, %s, now() - interval '1 hour', "
            "now() - make_interval(secs => %s))",
            (cluster, iid, kind, digest, tz, role, age))

    def now(self) -> datetime:
        return self.conn.execute("SELECT now()").fetchone()[0]


def seed(database_url: str) -> Seeded:
    """A fresh schema holding the story; drop it with ``drop``."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    cluster = f"c-{uuid.uuid4().hex[:10]}"
    admin = make_engine(normalize_url(database_url), "public", pool_size=1)
    migrate(admin, schema)
    admin.dispose()
    with psycopg.connect(libpq(database_url), options=f"-c search_path={schema}") as conn:
        s = Seeder(conn)
        now = s.now()
        base = now.replace(second=0, microsecond=0) - timedelta(minutes=60)
        base -= timedelta(minutes=base.minute % 10)  # an even minute: every-120s periods on m(2k)

        def m(n):
            return base + timedelta(minutes=n)

        v1 = s.version(spec("alpha", every=60, description=XSS), "alpha", base)
        s.period("alpha", v1, m(1), "emitted", job=("succeeded", 1))
        s.period("alpha", v1, m(2), "skipped", "overlap")
        # m(3): nothing recorded -> missing
        dead = s.period("alpha", v1, m(4), "emitted", job=("dead", 2, f"boom {XSS}"))
        s.attempt(dead, 1, "retry", "timeout after 30s", m(4))
        s.attempt(dead, 2, "dead", f"boom {XSS}", m(4) + timedelta(seconds=40))
        s.period("alpha", v1, m(5), "skipped", "paused")
        v2 = s.version(spec("alpha", every=120, description=XSS), "alpha",
                       m(5) + timedelta(seconds=30))
        s.period("alpha", v2, m(6), "emitted", job=("running", 1))
        # m(8): nothing recorded -> missing; then a yearly version: no period until January
        s.version(spec("alpha", cron="0 0 1 1 *", description=XSS), "alpha",
                  m(9) + timedelta(seconds=30))

        s.version(spec("gamma", every=60, grace=3600, owner="team-b"), "gamma",
                  now - timedelta(minutes=5))

        gap = last_gap_day(now)
        dst = spec("dst-nightly", cron="30 2 * * *", tz="America/New_York")
        vd = s.version(dst, "dst-nightly", (gap - timedelta(days=2)).replace(hour=0))
        for days in (-2, -1, 0, 1):
            local = (gap + timedelta(days=days)).replace(hour=2, minute=30)
            when = local.astimezone(UTC)
            if days == 0:  # 02:30 does not exist that day: the fire is at 03:00 EDT
                when = datetime(gap.year, gap.month, gap.day, 7, 0, tzinfo=UTC)
            s.period("dst-nightly", vd, when, "emitted", job=("succeeded", 1))
        s.version(None, "dst-nightly", gap + timedelta(days=1, hours=12))

        s.version(spec("march-sundays", cron="30 2 * 3 0", tz="America/New_York"),
                  "march-sundays", now - timedelta(hours=1))
        s.version(spec("november-sundays", cron="30 1 * 11 0", tz="America/New_York"),
                  "november-sundays", now - timedelta(hours=1))

        others = [s.job(f"import-{i}", None, None, None, "dead", 1, f"bad row {i}",
                        task="t.other") for i in (1, 2)]

        s.instance(cluster, "sched-a", digest="d1" * 32, age=1)
        s.instance(cluster, "sched-b", digest="d2" * 32, age=2)
        s.instance(cluster, "sched-old", digest="d1" * 32, age=600)
        s.instance(cluster, "worker-1", digest="", age=1, kind="worker", role="worker")
        conn.execute(
            "INSERT INTO leadership (cluster, term, instance_id, backend_pid, since, "
            "heartbeat_at) VALUES (%s, 7, 'sched-old', 1, now() - interval '1 hour', "
            "now() - interval '10 minutes')", (cluster,))
        conn.commit()
    return Seeded(database_url, schema, cluster, now, base, gap, [dead, *others])


def freshen(seeded: Seeded) -> None:
    """Heartbeats as seeded, again: the live instances beat a second ago, sched-old ten
    minutes ago (a module's tests can outlast the 30 s that make an instance stale)."""
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as conn:
        conn.execute("UPDATE instances SET heartbeat_at = now() - CASE instance_id "
                     "WHEN 'sched-old' THEN interval '10 minutes' ELSE interval '1 second' END "
                     "WHERE cluster = %s", (seeded.cluster,))


def drop(database_url: str, schema: str) -> None:
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def libpq(url: str) -> str:
    return normalize_url(url).render_as_string(hide_password=False).replace(
        "postgresql+psycopg://", "postgresql://")


class WebServer:
    """``cronkeeper web`` as a real process on a free loopback port (port 0: the server says
    which port it got on its first line)."""

    def __init__(self, url: str, schema: str, cluster: str, *args: str, log: Path,
                 env: dict | None = None) -> None:
        import os
        import time

        self.log = log
        self.out = open(log, "w")  # noqa: SIM115 - the child writes it until stop()
        self.proc = subprocess.Popen(
            [CRONKEEPER, "web", "--database-url", url, "--schema", schema, "--cluster", cluster,
             "--address", "127.0.0.1:0", *args],
            stdout=self.out, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 60
        while True:
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", log.read_text())
            if found:
                self.port = int(found.group(1))
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"cronkeeper web did not start: {log.read_text()}")
            time.sleep(0.05)
        self.base = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self.out.close()
