"""H, L and # against a reference written from their definitions, not from the implementation.

For each sampled expression the test holds a predicate written by hand from docs/schedules.md:
which local dates fire (the last day: tomorrow is day 1; the last Friday: a Friday with no
Friday a week later in its month; the second Monday: a Monday in days 8-14, ...) and which times
of the day, with each ``H`` worked out here from the documented hash (SHA-256 of
``NAME + " " + FIELD``, first 8 bytes big-endian, modulo the range). It never calls the parser
or the triggers for the reference side.

Local times become instants through ``zoneinfo`` alone, from SPEC §4 (cronie's rules): the
instants of a local time are those of its two readings (``fold=0`` and ``fold=1``) whose wall
time is that local time again. An elapsed-time cron (minute or hour field starting with ``*``)
fires at each of them; a fixed-time one (a hashed value is a fixed value) at the first, and at
the end of the gap (the first instant whose wall time is past it) when there is none. The two
lists are compared instant by instant over 2026-2030 in UTC, New York, Berlin and Lord Howe
(whose DST moves the clock by 30 minutes). Candidate dates come first, then only their times:
5 years of minutes per zone, without walking 2.6 million of them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from cronkeeper.timing import make_trigger

ZONES = ("UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe")
FROM = datetime(2026, 1, 1, tzinfo=UTC)
UNTIL = datetime(2031, 1, 1, tzinfo=UTC)  # exclusive


def h(name: str, field: str) -> int:
    """The documented hash, written again here."""
    return int.from_bytes(hashlib.sha256(f"{name} {field}".encode()).digest()[:8], "big")


def month_length(d: date) -> int:
    following = date(d.year + d.month // 12, d.month % 12 + 1, 1)
    return (following - timedelta(days=1)).day


def weekday(d: date) -> int:
    """0 = Sunday, as cron counts."""
    return d.isoweekday() % 7


def last_day(d: date, before: int = 0) -> bool:
    return d.day == month_length(d) - before


def last_weekday(d: date, day: int) -> bool:
    return weekday(d) == day and d.day + 7 > month_length(d)


def nth_weekday(d: date, day: int, n: int) -> bool:
    return weekday(d) == day and (d.day - 1) // 7 + 1 == n


@dataclass(frozen=True)
class Sample:
    cron: str
    name: str
    fixed: bool  # cronie's class, decided here by reading the rule, not asked of the code
    day: Callable[[date], bool]
    time: Callable[[int, int, int], bool]  # hour, minute, second
    seconds: bool = False  # a 6-field expression: times of the day to the second


N1, N2, N3, N4 = "tenant-0042", "nightly-invoices", "reports.weekly", "lh-gap"
SAMPLES = [
    # L and L-N
    Sample("0 0 L * *", "", True, last_day, lambda hr, mn, sc: (hr, mn) == (0, 0)),
    Sample("30 2 L * *", "", True, last_day, lambda hr, mn, sc: (hr, mn) == (2, 30)),  # Berlin
    Sample("15 1 L-1 * *", "", True, lambda d: last_day(d, 1), lambda hr, mn, sc: (hr, mn) == (1, 15)),
    Sample("0 6 L-3 2 *", "", True, lambda d: d.month == 2 and last_day(d, 3),
           lambda hr, mn, sc: (hr, mn) == (6, 0)),
    Sample("0 0 L-30 * *", "", True, lambda d: last_day(d, 30), lambda hr, mn, sc: (hr, mn) == (0, 0)),
    Sample("*/30 * L * *", "", False, last_day, lambda hr, mn, sc: mn % 30 == 0),
    # NL and N#K (names too), at DST changes: NY 2nd Sunday of March, 1st of November; Berlin
    # last Sundays of March and October; Lord Howe 1st Sundays of April and October
    Sample("30 1,2 * * 0#2", "", True, lambda d: nth_weekday(d, 0, 2),
           lambda hr, mn, sc: hr in (1, 2) and mn == 30),
    Sample("45 1 * * sun#1", "", True, lambda d: nth_weekday(d, 0, 1),
           lambda hr, mn, sc: (hr, mn) == (1, 45)),
    Sample("15 2 * * 0L", "", True, lambda d: last_weekday(d, 0), lambda hr, mn, sc: (hr, mn) == (2, 15)),
    Sample("*/20 1-2 * * SUN#1", "", False, lambda d: nth_weekday(d, 0, 1),
           lambda hr, mn, sc: hr in (1, 2) and mn % 20 == 0),
    Sample("0 9 * jan,jul mon#5", "", True, lambda d: d.month in (1, 7) and nth_weekday(d, 1, 5),
           lambda hr, mn, sc: (hr, mn) == (9, 0)),
    Sample("0 9 * * friL,7#3", "", True,
           lambda d: last_weekday(d, 5) or nth_weekday(d, 0, 3), lambda hr, mn, sc: (hr, mn) == (9, 0)),
    # both day fields restricted: a day matching either fires; '*'-led: both must
    Sample("0 12 L * 5L", "", True, lambda d: last_day(d) or last_weekday(d, 5),
           lambda hr, mn, sc: (hr, mn) == (12, 0)),
    Sample("0 12 1,15 * mon#2", "", True, lambda d: d.day in (1, 15) or nth_weekday(d, 1, 2),
           lambda hr, mn, sc: (hr, mn) == (12, 0)),
    Sample("0 3 */2 * 3L", "", True, lambda d: d.day % 2 == 1 and last_weekday(d, 3),
           lambda hr, mn, sc: (hr, mn) == (3, 0)),
    # H: minute, hour, day of month (1-28), day of week (0-6), ranges and steps
    Sample("H H * * *", N1, True, lambda d: True,
           lambda hr, mn, sc: (hr, mn) == (h(N1, "hour") % 24, h(N1, "minute") % 60)),
    Sample("H 2 * * *", N2, True, lambda d: True,
           lambda hr, mn, sc: (hr, mn) == (2, h(N2, "minute") % 60)),
    Sample("H(30-59) 1 * * *", N2, True, lambda d: True,
           lambda hr, mn, sc: (hr, mn) == (1, 30 + h(N2, "minute") % 30)),
    Sample("H(0-29) 2 * * sun#1", N4, True, lambda d: nth_weekday(d, 0, 1),
           lambda hr, mn, sc: (hr, mn) == (2, h(N4, "minute") % 30)),
    Sample("H/15 H(1-2) * * 0L", N3, True, lambda d: last_weekday(d, 0),
           lambda hr, mn, sc: hr == 1 + h(N3, "hour") % 2 and mn % 15 == h(N3, "minute") % 15),
    Sample("H/15 * * 3,4,10,11 *", N1, False, lambda d: d.month in (3, 4, 10, 11),
           lambda hr, mn, sc: mn % 15 == h(N1, "minute") % 15),
    Sample("H(0-29)/10 H(9-17) * * mon-fri", N3, True, lambda d: 1 <= weekday(d) <= 5,
           lambda hr, mn, sc: hr == 9 + h(N3, "hour") % 9 and mn < 30 and mn % 10 == h(N3, "minute") % 10),
    Sample("H H H * *", N2, True, lambda d: d.day == 1 + h(N2, "day-of-month") % 28,
           lambda hr, mn, sc: (hr, mn) == (h(N2, "hour") % 24, h(N2, "minute") % 60)),
    Sample("0 7 * * H", N3, True, lambda d: weekday(d) == h(N3, "day-of-week") % 7,
           lambda hr, mn, sc: (hr, mn) == (7, 0)),
    Sample("0 5 H(1-7) * H(mon-fri)", N1, True,  # both restricted: either
           lambda d: d.day == 1 + h(N1, "day-of-month") % 7
           or weekday(d) == 1 + h(N1, "day-of-week") % 5, lambda hr, mn, sc: (hr, mn) == (5, 0)),
    Sample("0 4 * H/3 *", N1, True, lambda d: (d.month - 1 - h(N1, "month") % 3) % 3 == 0,
           lambda hr, mn, sc: (hr, mn) == (4, 0)),
    # six fields: the seconds too
    Sample("H/20 30 2 * * 0#2", N4, True, lambda d: nth_weekday(d, 0, 2),
           lambda hr, mn, sc: (hr, mn) == (2, 30) and sc % 20 == h(N4, "second") % 20, seconds=True),
    Sample("H * 1 * * SUN#1", N1, False, lambda d: nth_weekday(d, 0, 1),
           lambda hr, mn, sc: hr == 1 and sc == h(N1, "second") % 60, seconds=True),
    # plain forms beside them
    Sample("30 2 * * *", "", True, lambda d: True, lambda hr, mn, sc: (hr, mn) == (2, 30)),
    Sample("0 0 29 2 *", "", True, lambda d: (d.month, d.day) == (2, 29),
           lambda hr, mn, sc: (hr, mn) == (0, 0)),
]


def times_of_day(sample: Sample) -> list[int]:
    if sample.seconds:
        return [s for s in range(86400) if sample.time(s // 3600, s // 60 % 60, s % 60)]
    return [m * 60 for m in range(1440) if sample.time(m // 60, m % 60, 0)]


def reference(sample: Sample, zone_name: str) -> list[int]:
    """Fire instants (Unix seconds) in [FROM, UNTIL), by the rules in the module docstring."""
    zone = ZoneInfo(zone_name)
    tods = times_of_day(sample)
    fires: set[int] = set()
    day = (FROM - timedelta(days=2)).date()
    while day <= UNTIL.date() + timedelta(days=1):
        if sample.day(day):
            midnight = datetime(day.year, day.month, day.day)
            for tod in tods:
                local = midnight + timedelta(seconds=tod)
                found = instants_of(local, zone)
                if sample.fixed:
                    fires.add(min(found) if found else gap_end(local, zone))
                else:
                    fires.update(found)
        day += timedelta(days=1)
    lo, hi = int(FROM.timestamp()), int(UNTIL.timestamp())
    return sorted(t for t in fires if lo <= t < hi)


def wall(t: int, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(t, zone).replace(tzinfo=None)


def instants_of(local: datetime, zone: ZoneInfo) -> list[int]:
    """Every instant whose wall time is ``local``: none in a gap, two in a fold."""
    found = {int(local.replace(tzinfo=zone, fold=fold).timestamp()) for fold in (0, 1)}
    return sorted(t for t in found if wall(t, zone) == local)


def gap_end(local: datetime, zone: ZoneInfo) -> int:
    """The first instant whose wall time is past ``local`` (a time the gap skips)."""
    lo, hi = sorted(int(local.replace(tzinfo=zone, fold=f).timestamp()) for f in (0, 1))
    assert wall(lo, zone) < local < wall(hi, zone)
    while hi - lo > 1:  # wall(lo) < local < wall(hi): narrow to the jump
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if wall(mid, zone) < local else (lo, mid)
    return hi


def implementation(sample: Sample, zone_name: str) -> list[int]:
    trigger = make_trigger(cron=sample.cron, every=None, timezone=zone_name, name=sample.name)
    end = UNTIL - timedelta(seconds=1)
    return [int(t.timestamp()) for t in trigger.fires(FROM - timedelta(seconds=1), end)]


@pytest.mark.parametrize("zone", ZONES)
def test_every_fire_matches_the_reference(zone: str) -> None:
    compared = 0
    for sample in SAMPLES:
        expected = reference(sample, zone)
        got = implementation(sample, zone)
        if got != expected:
            only_ref = sorted(set(expected) - set(got))[:3]
            only_impl = sorted(set(got) - set(expected))[:3]
            show = [datetime.fromtimestamp(t, ZoneInfo(zone)).isoformat() for t in only_ref]
            extra = [datetime.fromtimestamp(t, ZoneInfo(zone)).isoformat() for t in only_impl]
            pytest.fail(f"{sample.cron!r} ({sample.name}) in {zone}: missing {show}, extra {extra}")
        assert expected, sample.cron  # every sample fires in the five years
        compared += len(expected)
    assert compared > 40_000


def test_the_samples_meet_the_dst_changes_they_are_for() -> None:
    """The samples reach the gaps and folds (else the comparison would prove little): in each
    DST zone some fixed-time sample fires at a gap's end, and some elapsed one twice in a fold."""
    for zone_name in ZONES[1:]:
        zone = ZoneInfo(zone_name)
        gap_fires = fold_repeats = 0
        for sample in SAMPLES:
            for t in reference(sample, zone_name):
                local = wall(t, zone)
                if sample.fixed and not sample.time(local.hour, local.minute, local.second):
                    gap_fires += 1  # fired at a time it does not name: a gap's end
                elif not sample.fixed and len(instants_of(local, zone)) == 2:
                    fold_repeats += 1
        assert gap_fires >= 5 and fold_repeats >= 5, (zone_name, gap_fires, fold_repeats)


# -- calendars ---------------------------------------------------------------------------------
# A calendar's dates skip the periods on them (reason calendar); with on_calendar = "next_day"
# the times of day a listed date names also fire on the next unlisted day, each time once, by
# the fixed-time rule (the first occurrence in a fold, the gap's end in a gap), and a moved fire
# at an instant the schedule fires anyway is that one period. Written again here from
# docs/schedules.md ("Calendars"): the listed dates are read in the zone, runs of them walked by
# hand, local times placed with zoneinfo alone as above. The implementation's side is the
# planner's decisions over the spec's trigger: what the leader does.

CALENDAR_SAMPLES = [
    *(s for s in SAMPLES if s.cron in (
        "0 0 L * *", "30 2 L * *", "*/30 * L * *", "30 1,2 * * 0#2", "15 2 * * 0L",
        "H H * * *", "H(0-29) 2 * * sun#1", "H/15 * * 3,4,10,11 *", "H/20 30 2 * * 0#2",
        "30 2 * * *")),
    # Saturdays at the hours DST changes meet on Sundays: listed Saturdays before a change move
    # into its gap or fold (New York 02:00-03:00 / 01:00-02:00, Berlin 02:00-03:00 both ways,
    # Lord Howe 02:00-02:30 / 01:30-02:00)
    Sample("15,45 1,2 * * sat", "", True, lambda d: weekday(d) == 6,
           lambda hr, mn, sc: hr in (1, 2) and mn in (15, 45)),
    Sample("*/30 1-2 * * 6", "", False, lambda d: weekday(d) == 6,
           lambda hr, mn, sc: hr in (1, 2) and mn % 30 == 0),
    Sample("H H(1-2) * * sat", N3, True, lambda d: weekday(d) == 6,
           lambda hr, mn, sc: hr == 1 + h(N3, "hour") % 2 and mn == h(N3, "minute") % 60),
]


def dst_days(zone_name: str) -> list[date]:
    """The local dates in 2026-2030 whose UTC offset at 23:59 is not the one at 00:00."""
    zone = ZoneInfo(zone_name)
    days, day = [], FROM.date()
    while day < UNTIL.date():
        start = datetime(day.year, day.month, day.day, tzinfo=zone)
        if start.utcoffset() != start.replace(hour=23, minute=59).utcoffset():
            days.append(day)
        day += timedelta(days=1)
    return days


def listed_dates(zone_name: str) -> set[date]:
    """Dates meant to meet every case: the two days before each DST change (a run of two whose
    fires move onto the change), some changes themselves, month ends (the L samples), a run of
    five at each new year, and 120 dates drawn at random."""
    import random

    rng = random.Random(25)
    listed = {FROM.date() + timedelta(days=rng.randrange((UNTIL - FROM).days)) for _ in range(120)}
    for i, change in enumerate(dst_days(zone_name)):
        listed.update({change - timedelta(days=1), change - timedelta(days=2)})
        if i % 3 == 0:
            listed.add(change)
    for year in range(FROM.year, UNTIL.year):
        listed.update(date(year, 12, 29) + timedelta(days=k) for k in range(5))
        for month in (1, 5, 9):
            listed.add(date(year, month + 1, 1) - timedelta(days=1))
    return {d for d in listed if FROM.date() <= d < UNTIL.date()}


def calendar_reference(sample: Sample, zone_name: str, listed: set[date],
                       fires: list[int]) -> tuple[list, list]:
    """(instants emitted, instants skipped for the calendar) with ``next_day``, by the rules
    above, from the sample's ``reference`` fires."""
    zone = ZoneInfo(zone_name)
    skipped = [t for t in fires if wall(t, zone).date() in listed]
    emitted = set(fires) - set(skipped)
    tods = times_of_day(sample)
    lo, hi = int(FROM.timestamp()), int(UNTIL.timestamp())
    for day in sorted(listed):
        following = day + timedelta(days=1)
        if following in listed:
            continue  # not the end of its run
        run = [day]
        while run[-1] - timedelta(days=1) in listed:
            run.append(run[-1] - timedelta(days=1))
        midnight = datetime(following.year, following.month, following.day)
        for listed_day in run:
            if not sample.day(listed_day):
                continue
            for tod in tods:
                local = midnight + timedelta(seconds=tod)
                found = instants_of(local, zone)
                t = min(found) if found else gap_end(local, zone)
                if lo <= t < hi:
                    emitted.add(t)
    return sorted(emitted), skipped


@pytest.mark.parametrize("zone", ZONES)
def test_calendars_match_the_reference(zone: str) -> None:
    from cronkeeper.planning import Outcome, Reason, plan
    from cronkeeper.schedule.model import Misfire, OnCalendar, ScheduleSpec
    from cronkeeper.timing.calendars import Calendar

    listed = listed_dates(zone)
    calendar = Calendar.of("holidays", listed)
    moved_seen = gaps_met = 0
    for sample in CALENDAR_SAMPLES:
        plain = reference(sample, zone)
        for policy in OnCalendar:
            spec = ScheduleSpec(sample.name or "calendar-sample", zone, Misfire.CATCH_UP,
                                cron=sample.cron, catch_up_limit=1e10, task="t",
                                calendar=calendar, on_calendar=policy)
            fires = list(spec.trigger().fires(FROM - timedelta(seconds=1),
                                              UNTIL - timedelta(seconds=1)))
            decisions = plan(spec, fires, UNTIL, paused=(), busy=False)
            emitted = [int(d.scheduled_for.timestamp()) for d in decisions
                       if d.outcome is Outcome.EMITTED]
            skipped = [int(d.scheduled_for.timestamp()) for d in decisions
                       if d.reason is Reason.CALENDAR]
            assert len(emitted) + len(skipped) == len(decisions) == len(fires)
            want_emitted, want_skipped = calendar_reference(sample, zone, listed, plain)
            if policy is OnCalendar.SKIP:  # nothing moves: the plain fires less the listed
                want_emitted = sorted(set(plain) - set(want_skipped))
            assert skipped == want_skipped, (sample.cron, policy)
            if emitted != want_emitted:
                only_ref = [wall(t, ZoneInfo(zone)).isoformat()
                            for t in sorted(set(want_emitted) - set(emitted))[:3]]
                only_impl = [wall(t, ZoneInfo(zone)).isoformat()
                             for t in sorted(set(emitted) - set(want_emitted))[:3]]
                pytest.fail(f"{sample.cron!r} {policy} in {zone}: missing {only_ref}, "
                            f"extra {only_impl}")
            assert skipped, sample.cron  # every sample meets the calendar
            if policy is OnCalendar.NEXT_DAY:
                moved = set(emitted) - set(plain)
                moved_seen += len(moved)
                gaps_met += sum(1 for t in moved
                                if not sample.time(*(lambda w: (w.hour, w.minute, w.second))(
                                    wall(t, ZoneInfo(zone)))))
    assert moved_seen > 100  # fires that moved to a day they would not have fired on
    if zone != "UTC":
        assert gaps_met >= 1, zone  # a moved time that the day did not have: the gap's end
