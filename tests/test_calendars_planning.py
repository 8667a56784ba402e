"""What a calendar decides, as tables of cases with no database: the planner skips the periods
on listed local dates (reason ``calendar``) before any other rule; ``next_day`` moves fires
(DST included); the audit judges each period by its own version's calendar and never calls a
listed period missing; the web's strip and the metrics show the reason."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from cronkeeper import metrics as m
from cronkeeper.audit import Record, Version, audit_schedule
from cronkeeper.planning import ALWAYS_PAUSED, Decision, Outcome, Reason, calendar_mark, plan
from cronkeeper.schedule.model import Misfire, OnCalendar, Overlap, ScheduleSet, ScheduleSpec
from cronkeeper.timing.calendars import Calendar, MovedTrigger
from cronkeeper.web.strip import CellState, build_strip

NY = "America/New_York"
XMAS = Calendar.of("holidays", [date(2026, 12, 24), date(2026, 12, 25), date(2027, 1, 1)])


def spec(cron: str = "0 9 * * *", zone: str = NY, misfire: Misfire = Misfire.SKIP,
         calendar: Calendar | None = XMAS, on: OnCalendar = OnCalendar.SKIP,
         **extra) -> ScheduleSpec:
    return ScheduleSpec("s", zone, misfire, cron=cron, task="t", grace=60, calendar=calendar,
                        on_calendar=on, **extra)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def decided(decisions: list[Decision]) -> list[tuple[str, str, str | None]]:
    return [(d.scheduled_for.strftime("%Y-%m-%dT%H:%MZ"), str(d.outcome),
             d.reason.value if d.reason else None) for d in decisions]


# -- the planner --------------------------------------------------------------------------------

def test_listed_periods_are_skipped_for_the_calendar_before_any_other_rule():
    due = [utc("2026-12-23T14:00Z"), utc("2026-12-24T14:00Z"), utc("2026-12-25T14:00Z"),
           utc("2026-12-26T14:00Z")]
    now = utc("2026-12-26T14:00:30Z")
    assert decided(plan(spec(), due, now, paused=(), busy=False)) == [
        ("2026-12-23T14:00Z", "skipped", "misfire"),  # late, and not listed
        ("2026-12-24T14:00Z", "skipped", "calendar"),  # late, but never meant to fire
        ("2026-12-25T14:00Z", "skipped", "calendar"),
        ("2026-12-26T14:00Z", "emitted", None),
    ]
    assert decided(plan(spec(), due, now, paused=ALWAYS_PAUSED, busy=False))[1:3] == [
        ("2026-12-24T14:00Z", "skipped", "calendar"), ("2026-12-25T14:00Z", "skipped", "calendar")]
    busy = plan(spec(overlap=Overlap.SKIP), due[1:], now, paused=(), busy=True)
    assert decided(busy) == [("2026-12-24T14:00Z", "skipped", "calendar"),
                             ("2026-12-25T14:00Z", "skipped", "calendar"),
                             ("2026-12-26T14:00Z", "skipped", "overlap")]


def test_latest_coalesces_only_the_unlisted_late_periods():
    due = [utc("2026-12-23T14:00Z"), utc("2026-12-24T14:00Z"), utc("2026-12-25T14:00Z")]
    now = utc("2026-12-25T14:00:30Z")  # the last one is on time, but listed
    assert decided(plan(spec(misfire=Misfire.LATEST), due, now, paused=(), busy=False)) == [
        ("2026-12-23T14:00Z", "emitted", None),  # the newest late one: no on-time one follows
        ("2026-12-24T14:00Z", "skipped", "calendar"),
        ("2026-12-25T14:00Z", "skipped", "calendar"),
    ]


@pytest.mark.parametrize(("zone", "listed"), [
    ("America/New_York", False),  # 2026-12-25T03:00Z is 22:00 on the 24th there
    ("Europe/Berlin", True),  # 04:00 on the 25th
    ("UTC", True),
])
def test_the_listed_date_is_the_local_date_in_the_schedules_zone(zone, listed):
    only_25th = Calendar.of("only-25th", [date(2026, 12, 25)])
    s = spec(zone=zone, calendar=only_25th)
    (d,) = plan(s, [utc("2026-12-25T03:00Z")], utc("2026-12-25T03:00Z"), paused=(),
                busy=False)
    assert (d.reason is Reason.CALENDAR) is listed


def test_a_schedule_without_a_calendar_plans_as_before():
    due = [utc("2026-12-25T14:00Z")]
    assert plan(spec(calendar=None), due, due[0], paused=(), busy=False) == [
        Decision(due[0], Outcome.EMITTED)]


# -- next_day --------------------------------------------------------------------------------------

def fires(s: ScheduleSpec, after: str, until: str) -> list[str]:
    return [t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in s.trigger().fires(utc(after), utc(until))]


def test_next_day_moves_a_weekly_fire_and_merges_into_a_daily_one():
    weekly = spec("0 9 * * thu", on=OnCalendar.NEXT_DAY)  # 2026-12-24 is a Thursday
    assert isinstance(weekly.trigger(), MovedTrigger)
    assert fires(weekly, "2026-12-20T00:00Z", "2026-12-31T23:59Z") == [
        "2026-12-24T14:00:00Z",  # skipped by the planner
        "2026-12-26T14:00:00Z",  # moved past the run 24-25 to the first unlisted day
        "2026-12-31T14:00:00Z",
    ]
    daily = spec("0 9 * * *", on=OnCalendar.NEXT_DAY)  # the 26th fires at 09:00 anyway: once
    assert fires(daily, "2026-12-23T00:00Z", "2026-12-27T00:00Z") == [
        "2026-12-23T14:00:00Z", "2026-12-24T14:00:00Z", "2026-12-25T14:00:00Z",
        "2026-12-26T14:00:00Z"]
    trigger = daily.trigger()
    assert calendar_mark(daily, trigger, utc("2026-12-26T14:00Z")) is None  # its own fire
    mark = calendar_mark(weekly, weekly.trigger(), utc("2026-12-26T14:00Z"))
    assert mark is not None and mark.kind == "moved" and mark.days == (date(2026, 12, 24),)


@pytest.mark.parametrize(("cron", "listed", "moved"), [
    # 2026-03-08 New York: 02:00 -> 03:00. 02:30 that day does not exist: the gap's end
    ("30 2 * * sat", date(2026, 3, 7), "2026-03-08T07:00:00Z"),
    # 2026-11-01 New York: 02:00 -> 01:00. 01:30 happens twice: the first (EDT)
    ("30 1 * * sat", date(2026, 10, 31), "2026-11-01T05:30:00Z"),
    # an elapsed-time cron moves by the same rule: once, at the first occurrence
    ("*/30 1 * * sat", date(2026, 10, 31), "2026-11-01T05:00:00Z"),
])
def test_next_day_places_a_moved_time_by_the_fixed_time_rule(cron, listed, moved):
    s = spec(cron, calendar=Calendar.of("h", [listed]), on=OnCalendar.NEXT_DAY)
    sunday = listed + timedelta(days=1)
    on_sunday = [t for t in s.trigger().fires(utc(f"{sunday}T00:00Z"), utc(f"{sunday}T12:00Z"))]
    assert moved in [t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in on_sunday]
    assert len(on_sunday) == len(set(on_sunday))
    if cron.startswith("*/30"):  # 01:00 and 01:30, each once, though the fold repeats them
        assert [t.strftime("%H:%M") for t in on_sunday] == ["05:00", "05:30"]


def test_an_every_schedule_moves_its_wall_times():
    # every day at 00:00Z: 19:00 EST, 20:00 EDT. Saturday 2026-03-07's 19:00 moves to Sunday
    # 19:00, which is EDT by then (23:00Z), beside Sunday's own 20:00 EDT (00:00Z on the 9th)
    s = ScheduleSpec("s", NY, Misfire.SKIP, every=86400, task="t",
                     calendar=Calendar.of("h", [date(2026, 3, 7)]), on_calendar=OnCalendar.NEXT_DAY)
    assert fires(s, "2026-03-07T12:00Z", "2026-03-09T12:00Z") == [
        "2026-03-08T00:00:00Z", "2026-03-08T23:00:00Z", "2026-03-09T00:00:00Z"]


def test_next_day_triggers_are_shared_like_plain_ones():
    a, b = spec(on=OnCalendar.NEXT_DAY), spec(on=OnCalendar.NEXT_DAY)
    assert a.trigger() is b.trigger()
    assert spec(on=OnCalendar.SKIP).trigger() is spec(calendar=None).trigger()


# -- the audit -------------------------------------------------------------------------------------

def test_each_version_is_judged_by_its_own_calendar_and_none_is_missing():
    """v1 lists the 24th; v2 (the file changed on the 25th at 12:00Z) lists the 26th instead.
    Nothing was recorded for the listed days (no leader then): they are calendar skips, never
    missing; the other unrecorded day is missing."""
    v1 = spec(calendar=Calendar.of("h", [date(2026, 12, 24)]))
    v2 = spec(calendar=Calendar.of("h", [date(2026, 12, 26)]))
    versions = [Version("s", 1, v1, utc("2026-12-20T00:00Z")),
                Version("s", 2, v2, utc("2026-12-25T12:00Z"))]
    records = [Record.of(utc("2026-12-23T14:00Z"), "emitted", emitted_at=utc("2026-12-23T14:00:01Z"),
                         job_state="succeeded", attempts=1),
               Record.of(utc("2026-12-27T14:00Z"), "skipped", "calendar")]  # recorded as is
    rows, summary = audit_schedule("s", versions, records, since=utc("2026-12-23T00:00Z"),
                                   until=utc("2026-12-28T00:00Z"), now=utc("2026-12-28T00:00Z"))
    assert [(r.scheduled_for, r.status, r.reason) for r in rows] == [
        ("2026-12-23T14:00:00Z", "emitted", None),
        ("2026-12-24T14:00:00Z", "skipped", "calendar"),  # v1 lists it
        ("2026-12-25T14:00:00Z", "missing", None),  # v2 is in force and does not list it
        ("2026-12-26T14:00:00Z", "skipped", "calendar"),  # v2 lists it
        ("2026-12-27T14:00:00Z", "skipped", "calendar"),  # as recorded
    ]
    assert (summary.emitted, summary.skipped, summary.missing) == (1, 3, 1)


def test_the_audit_expects_moved_fires():
    s = spec("0 9 * * thu", on=OnCalendar.NEXT_DAY)
    versions = [Version("s", 1, s, utc("2026-12-20T00:00Z"))]
    rows, _ = audit_schedule("s", versions, [], since=utc("2026-12-20T00:00Z"),
                             until=utc("2026-12-27T00:00Z"), now=utc("2026-12-27T00:00Z"))
    assert [(r.scheduled_for, r.status, r.reason) for r in rows] == [
        ("2026-12-24T14:00:00Z", "skipped", "calendar"),
        ("2026-12-26T14:00:00Z", "missing", None),  # the moved fire is a period of its own
    ]


# -- what shows it ----------------------------------------------------------------------------------

def test_the_strip_shows_a_calendar_skip_as_skipped_with_its_reason():
    versions = [Version("s", 1, spec(), utc("2026-12-23T00:00Z"))]
    strip = build_strip("s", versions, [], since=utc("2026-12-23T00:00Z"),
                        now=utc("2026-12-25T15:00Z"))
    assert [c.state for c in strip.cells] == [CellState.MISSING, CellState.SKIPPED,
                                              CellState.SKIPPED]
    assert strip.cells[1].reason == "calendar"
    assert strip.cells[1].title == ("2026-12-24 09:00:00 EST (UTC-0500), 2026-12-24T14:00:00Z: "
                                    "skipped (reason: calendar)")


def test_metrics_count_calendar_skips_by_reason():
    reg = CollectorRegistry()
    x = m.Metrics(reg)
    t = utc("2026-12-25T14:00Z")
    x.observe_tick(SimpleNamespace(now=t, decisions=[
        ("s", Decision(t, Outcome.SKIPPED, Reason.CALENDAR), None)]),
        ScheduleSet((spec(owner="team-a"),)))
    assert reg.get_sample_value("cronkeeper_fires_total", {
        "schedule": "s", "owner": "team-a", "outcome": "skipped", "reason": "calendar"}) == 1
    assert reg.get_sample_value("cronkeeper_fires_total", {
        "schedule": "s", "owner": "team-a", "outcome": "emitted", "reason": ""}) is None


def test_the_web_marks_next_fires_skipped_and_moved():
    from cronkeeper.web.pages import next_fires

    weekly = spec("30 9 * * thu", calendar=Calendar.of("h", [date(2026, 12, 24)]),
                  on=OnCalendar.NEXT_DAY)
    fires = next_fires(Version("s", 1, weekly, utc("2026-01-01T00:00Z")), utc("2026-12-20T00:00Z"),
                       3)
    assert [(f["utc"], f["calendar"], f["calendar_note"]) for f in fires] == [
        ("2026-12-24T14:30:00Z", "skipped", "skipped: calendar 'h' lists 2026-12-24"),
        ("2026-12-25T14:30:00Z", "moved", "moved from 2026-12-24 (calendar 'h' lists it)"),
        ("2026-12-31T14:30:00Z", None, None),
    ]


def test_schedules_share_a_plan_only_with_the_same_calendar_in_the_same_zone():
    """The leader shares one plan among schedules of one family with the same due periods: a
    family holds the calendar and the zone its dates are read in, and only when there is one."""
    from cronkeeper.versions import VersionsInForce

    families = VersionsInForce(None)  # type: ignore[arg-type]  # no term: nothing is read
    ny, berlin = spec(zone=NY), spec(zone="Europe/Berlin")
    assert families.family(ny) is not families.family(berlin)
    assert families.family(ny) is families.family(spec(zone=NY))
    other = spec(zone=NY, calendar=Calendar.of("h", [date(2026, 12, 24)]))
    assert families.family(ny) is not families.family(other)
    assert families.family(spec(zone=NY, calendar=None)) is families.family(
        spec(zone="Europe/Berlin", calendar=None))
