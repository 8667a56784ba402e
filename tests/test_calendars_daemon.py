"""Calendars in a running daemon (issue 25 item 3): a schedule every second whose calendar lists
today's date in its zone records calendar skips, never a job, and `history` exits 0 with them;
``next_day`` fires on today the seconds of a listed yesterday that the schedule alone would
never fire; after the calendar file changes (SIGHUP), the old version's periods stay judged by
the old version's dates, even with their records gone.

"Today" is read in a zone where the local time is between 02:00 and 21:00, so the few minutes
a test runs never cross a local midnight."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import sqlalchemy as sa
from handlers_for_tests import wait_until
from test_metrics_daemon import free_port, scrape, spawn_daemon, stop

ZONES = ("UTC", "Asia/Tokyo", "America/New_York", "Europe/Berlin", "America/Los_Angeles",
         "Asia/Kolkata", "Pacific/Auckland")
DOW = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def db_now(engine) -> datetime:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()


def zone_in_daytime(now: datetime) -> str:
    return next(z for z in ZONES if 2 <= now.astimezone(ZoneInfo(z)).hour < 21)


def schedules(zone: str, dates: list[str], calendar: str = "days-off", **crons: str) -> str:
    """One file: the calendar, then a task schedule naming it per (name, cron)."""
    text = f"[calendars.{calendar}]\ndates = {json.dumps(dates)}\n"
    for name, cron in crons.items():
        policy = "next_day" if name.startswith("moved") else "skip"
        text += (f'\n["{name}"]\ncron = "{cron}"\ntimezone = "{zone}"\nmisfire = "skip"\n'
                 f'grace = "5s"\noverlap = "allow"\ntask = "t.x"\nowner = "team-a"\n'
                 f'calendar = "{calendar}"\non_calendar = "{policy}"\n')
    return text


def rows(engine, sql: str, **params) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def history(database_url: str, schema: str, *args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    return subprocess.run([exe, "history", "--database-url", database_url, "--schema", schema,
                           "--format", "json", *args], capture_output=True, text=True, timeout=60)


def test_calendar_skips_and_next_day_in_a_running_daemon(database_url, schema, cluster,
                                                         engine, tmp_path):
    started = db_now(engine)
    zone = zone_in_daytime(started)
    today = started.astimezone(ZoneInfo(zone)).date()
    yesterday = today - timedelta(days=1)
    yesterday_dow = DOW[(yesterday.isoweekday()) % 7]
    # every second, today listed: every period a calendar skip
    (tmp_path / "s.toml").write_text(schedules(zone, [str(today)], listed="* * * * * *"))
    (tmp_path / "t.toml").write_text(schedules(
        zone, [str(yesterday)], "other-days",
        # every second on yesterday's weekday only, yesterday listed, next_day: today, each
        # second of yesterday fires, moved
        **{"moved-here": f"* * * * * {yesterday_dow}", "free": "* * * * * *"},
    ))
    port = free_port()
    proc = spawn_daemon(database_url, schema, cluster, tmp_path, port)
    try:
        def decided(name: str, outcome: str, reason: str | None) -> int:
            return rows(engine, "SELECT count(*) FROM periods WHERE schedule = :s AND outcome = :o"
                        " AND reason IS NOT DISTINCT FROM :r", s=name, o=outcome, r=reason)[0][0]

        wait_until(lambda: decided("listed", "skipped", "calendar") >= 3
                   and decided("moved-here", "emitted", None) >= 3
                   and decided("free", "emitted", None) >= 3, 60,
                   message="calendar skips, moved fires and plain fires recorded")
        fired = ('cronkeeper_fires_total{outcome="skipped",owner="team-a",reason="calendar",'
                 'schedule="listed"}')
        wait_until(lambda: scrape(port).get(fired, 0) >= 3, 30, message="the metric counts them")
        missing = 'cronkeeper_periods_missing{owner="team-a",schedule="listed"}'
        wait_until(lambda: missing in scrape(port), 30, message="the audit's first result")
        assert scrape(port)[missing] == 0
    finally:
        stop(proc)
    # up to the last period every schedule decided: later ones are pending, whatever the load
    until = min(r[0] for r in rows(engine, "SELECT max(scheduled_for) FROM periods GROUP BY "
                                            "schedule"))

    # the listed schedule decided every period a calendar skip, and wrote no job
    assert rows(engine, "SELECT DISTINCT outcome, reason FROM periods WHERE schedule = 'listed'") \
        == [("skipped", "calendar")]
    assert rows(engine, "SELECT count(*) FROM outbox WHERE schedule = 'listed'") == [(0,)]
    # the moved fires are periods of their own, keyed <schedule>@<instant> as any other
    keys = rows(engine, "SELECT o.idempotency_key, p.scheduled_for FROM outbox o JOIN periods p "
                        "ON p.schedule = o.schedule AND p.scheduled_for = o.scheduled_for "
                        "WHERE o.schedule = 'moved-here'")
    assert keys and all(k == f"moved-here@{at.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
                        for k, at in keys)
    assert all(at.astimezone(ZoneInfo(zone)).date() == today for _, at in keys)

    result = history(database_url, schema, "--since", started.isoformat(), "--until",
                     until.isoformat())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    doc = json.loads(result.stdout)
    summary = {s["schedule"]: s for s in doc["summary"]}
    assert summary["listed"]["missing"] == 0 and summary["listed"]["emitted"] == 0
    assert summary["listed"]["skipped"] >= 3
    assert {(r["status"], r["reason"]) for r in doc["periods"] if r["schedule"] == "listed"} \
        == {("skipped", "calendar")}
    assert summary["moved-here"]["emitted"] >= 3 and summary["moved-here"]["missing"] == 0
    assert summary["free"]["skipped"] == 0 and summary["free"]["missing"] == 0

    # the explanation of one skip names the calendar and the local date
    first = rows(engine, "SELECT min(scheduled_for) FROM periods WHERE schedule = 'listed'")[0][0]
    key = f"listed@{first.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    explained = subprocess.run([exe, "explain", key, "--database-url", database_url, "--schema",
                                schema, "--format", "json"], capture_output=True, text=True,
                               timeout=60)
    assert explained.returncode == 0, explained.stderr
    story = json.loads(explained.stdout)
    assert story["decision"]["reason"] == "calendar"
    assert story["calendar"] == {"name": "days-off", "on_calendar": "skip", "timezone": zone,
                                 "local_date": str(today), "listed": True, "moved_from": []}
    text = subprocess.run([exe, "explain", key, "--database-url", database_url, "--schema",
                           schema], capture_output=True, text=True, timeout=60)
    assert "decision: skipped (calendar) at " in text.stdout
    assert (f"calendar: 'days-off' lists {today}, the period's local date in {zone}"
            in text.stdout.splitlines())


def test_an_old_version_stays_judged_by_its_own_calendar(database_url, schema, cluster, engine,
                                                         tmp_path):
    started = db_now(engine)
    zone = zone_in_daytime(started)
    today = started.astimezone(ZoneInfo(zone)).date()
    path = tmp_path / "s.toml"
    path.write_text(schedules(zone, [str(today)], listed="* * * * * *"))
    proc = spawn_daemon(database_url, schema, cluster, tmp_path)
    try:
        def count(outcome: str) -> int:
            return rows(engine, "SELECT count(*) FROM periods WHERE schedule = 'listed' AND "
                                "outcome = :o", o=outcome)[0][0]

        wait_until(lambda: count("skipped") >= 3, 60, message="calendar skips under version 1")
        # today is no longer listed: a new version of the schedule, from the reload on
        path.write_text(schedules(zone, [str(today + timedelta(days=1))], listed="* * * * * *"))
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: count("emitted") >= 3, 60, message="fires under version 2")
    finally:
        stop(proc)
    until = rows(engine, "SELECT max(scheduled_for) FROM periods WHERE schedule = 'listed'")[0][0]
    versions = rows(engine, "SELECT id, spec->'calendar'->'dates', active_from FROM "
                            "schedule_versions WHERE schedule = 'listed' ORDER BY id")
    assert [v[1] for v in versions] == [[str(today)], [str(today + timedelta(days=1))]]
    switched = versions[1][2]
    # every period before the switch a calendar skip, every one after it emitted
    assert rows(engine, "SELECT DISTINCT outcome FROM periods WHERE schedule = 'listed' AND "
                        "scheduled_for <= :t", t=switched) == [("skipped",)]
    assert rows(engine, "SELECT DISTINCT outcome FROM periods WHERE schedule = 'listed' AND "
                        "scheduled_for > :t", t=switched) == [("emitted",)]
    # the skips' records gone (as if no leader had run then): version 1's stored dates still
    # say those periods were never to fire, whatever the file says now
    with engine.begin() as conn:
        gone = conn.execute(sa.text("DELETE FROM periods WHERE schedule = 'listed' AND "
                                    "outcome = 'skipped'")).rowcount
    assert gone >= 3
    result = history(database_url, schema, "listed", "--since", started.isoformat(), "--until",
                     until.isoformat())
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    doc = json.loads(result.stdout)
    before = [r for r in doc["periods"]
              if datetime.fromisoformat(r["scheduled_for"].replace("Z", "+00:00")) <= switched]
    assert len(before) >= gone and {(r["status"], r["reason"]) for r in before} == {
        ("skipped", "calendar")}
    assert doc["summary"][0]["missing"] == 0
