"""Triggers: when each cron feature fires, `every`, the DST rules, and dst_anomalies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from cronkeeper.timing import (
    CronTrigger,
    TimingError,
    dst_anomalies,
    make_trigger,
    parse_cron,
)

NY = "America/New_York"


def z(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def iso(when: datetime) -> str:
    assert when.tzinfo is UTC
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def fires(cron: str, zone: str, after: str, until: str) -> list[str]:
    t = make_trigger(cron=cron, every=None, timezone=zone)
    return [iso(x) for x in t.fires(z(after), z(until))]


def first(cron: str, zone: str, after: str, n: int) -> list[str]:
    t = make_trigger(cron=cron, every=None, timezone=zone)
    out, when = [], z(after)
    for _ in range(n):
        nxt = t.next_fire(when)
        assert nxt is not None
        out.append(iso(nxt))
        when = nxt
    return out


# --- acceptance checks (SPEC §4) -----------------------------------------------------------------


def test_fold_fixed_time_fires_once_at_first_occurrence() -> None:
    expected = ["2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    assert fires("30 1 * * *", NY, "2026-10-31T00:00Z", "2026-11-02T12:00Z") == expected
    assert first("30 1 * * *", NY, "2026-10-31T00:00Z", 3) == expected
    t = make_trigger(cron="30 1 * * *", every=None, timezone=NY)
    assert t.next_fire(z("2026-11-01T00:00Z")) == z("2026-11-01T05:30Z")
    assert t.next_fire(z("2026-11-01T05:30Z")) == z("2026-11-02T06:30Z")  # not 06:30Z on Nov 1


def test_gap_fixed_time_fires_at_gap_end() -> None:
    expected = ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
    assert fires("30 2 * * *", NY, "2026-03-07T00:00Z", "2026-03-09T12:00Z") == expected
    assert first("30 2 * * *", NY, "2026-03-07T00:00Z", 3) == expected
    t = make_trigger(cron="30 2 * * *", every=None, timezone=NY)
    assert t.next_fire(z("2026-03-08T00:00Z")) == z("2026-03-08T07:00Z")
    assert t.next_fire(z("2026-03-08T07:00Z")) == z("2026-03-09T06:30Z")


# --- DST rules ---------------------------------------------------------------------------------


def test_elapsed_time_fires_each_occurrence_of_a_fold() -> None:
    got = fires("30 * * * *", NY, "2026-11-01T04:00Z", "2026-11-01T08:00Z")
    # 00:30 EDT, 01:30 EDT, 01:30 EST, 02:30 EST
    assert got == [
        "2026-11-01T04:30:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-01T06:30:00Z",
        "2026-11-01T07:30:00Z",
    ]


def test_elapsed_time_skips_a_gap() -> None:
    got = fires("30 * * * *", NY, "2026-03-08T05:00Z", "2026-03-08T08:00Z")
    assert got == ["2026-03-08T05:30:00Z", "2026-03-08T06:30:00Z", "2026-03-08T07:30:00Z"]
    # 01:30 EST = 06:30Z, then 03:30 EDT = 07:30Z: 02:30 never happened
    assert fires("*/30 2 * * *", NY, "2026-03-08T00:00Z", "2026-03-09T00:00Z") == []


def test_hourly_is_elapsed_time() -> None:
    t = make_trigger(cron="@hourly", every=None, timezone=NY)
    assert t.fixed_time is False
    got = [iso(x) for x in t.fires(z("2026-11-01T04:30Z"), z("2026-11-01T07:30Z"))]
    assert got == ["2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"]


def test_several_gap_times_collapse_into_one_fire_merged_with_a_regular_one() -> None:
    got = fires("0,15,30,45 2,3 * * *", NY, "2026-03-08T06:00Z", "2026-03-08T08:00Z")
    # 02:00..02:45 do not exist: one fire at 07:00Z, which is also 03:00 EDT's own fire
    assert got == [
        "2026-03-08T07:00:00Z",
        "2026-03-08T07:15:00Z",
        "2026-03-08T07:30:00Z",
        "2026-03-08T07:45:00Z",
    ]


def test_lord_howe_half_hour_shift() -> None:
    zone = "Australia/Lord_Howe"
    # 2026-10-04 02:00 +10:30 -> 02:30 +11 (15:30Z Oct 3): 02:15 is in the gap
    assert fires("15 2 * * *", zone, "2026-10-03T00:00Z", "2026-10-04T00:00Z") == [
        "2026-10-03T15:30:00Z"
    ]
    # 2026-04-05 02:00 +11 -> 01:30 +10:30 (15:00Z Apr 4): 01:45 occurs twice, fires once
    assert fires("45 1 * * *", zone, "2026-04-04T00:00Z", "2026-04-05T00:00Z") == [
        "2026-04-04T14:45:00Z"
    ]
    assert fires("45 * * * *", zone, "2026-04-04T14:00Z", "2026-04-04T16:00Z") == [
        "2026-04-04T14:45:00Z",
        "2026-04-04T15:15:00Z",  # 01:45 again, at +10:30
    ]


def test_six_field_seconds_in_a_gap_collapse() -> None:
    got = fires("*/20 30 2 * * *", NY, "2026-03-08T00:00Z", "2026-03-09T00:00Z")
    assert got == ["2026-03-08T07:00:00Z"]
    got = fires("*/20 30 2 * * *", NY, "2026-03-09T00:00Z", "2026-03-10T00:00Z")
    assert got == ["2026-03-09T06:30:00Z", "2026-03-09T06:30:20Z", "2026-03-09T06:30:40Z"]


# --- cron features, in UTC ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "after", "expected"),
    [
        ("0 0 * * *", "2026-01-01T00:00Z", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]),
        ("*/15 * * * *", "2026-01-01T00:07Z", ["2026-01-01T00:15:00Z", "2026-01-01T00:30:00Z"]),
        ("0 9 * * mon-fri", "2026-01-02T10:00Z", ["2026-01-05T09:00:00Z", "2026-01-06T09:00:00Z"]),
        ("0 9 * * 0", "2026-01-01T00:00Z", ["2026-01-04T09:00:00Z", "2026-01-11T09:00:00Z"]),
        ("0 9 * * 7", "2026-01-01T00:00Z", ["2026-01-04T09:00:00Z", "2026-01-11T09:00:00Z"]),
        ("0 9 * * SUN", "2026-01-01T00:00Z", ["2026-01-04T09:00:00Z", "2026-01-11T09:00:00Z"]),
        ("0 0 13 * 5", "2026-01-01T00:00Z", ["2026-01-02T00:00:00Z", "2026-01-09T00:00:00Z"]),
        ("0 0 13 * 5", "2026-02-12T00:00Z", ["2026-02-13T00:00:00Z", "2026-02-20T00:00:00Z"]),
        ("0 0 */13 * 5", "2026-01-01T00:00Z", ["2026-02-27T00:00:00Z", "2026-03-27T00:00:00Z"]),
        ("0 0 13 * */5", "2026-01-01T00:00Z", ["2026-02-13T00:00:00Z", "2026-03-13T00:00:00Z"]),
        ("0 0 1 jan,jul *", "2026-01-01T00:00Z", ["2026-07-01T00:00:00Z", "2027-01-01T00:00:00Z"]),
        ("0 0 29 2 *", "2026-01-01T00:00Z", ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]),
        ("0 0 31 * *", "2026-04-01T00:00Z", ["2026-05-31T00:00:00Z", "2026-07-31T00:00:00Z"]),
        ("15 10 * * * *", "2026-01-01T00:00Z", ["2026-01-01T00:10:15Z", "2026-01-01T01:10:15Z"]),
        ("@weekly", "2026-01-01T00:00Z", ["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"]),
        ("@monthly", "2026-01-15T00:00Z", ["2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"]),
        ("@yearly", "2026-01-01T00:00Z", ["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"]),
        ("@daily", "2026-12-31T23:59:59.5Z", ["2027-01-01T00:00:00Z", "2027-01-02T00:00:00Z"]),
    ],
)
def test_features(cron: str, after: str, expected: list[str]) -> None:
    assert first(cron, "UTC", after, 2) == expected
    until = z(expected[-1])
    assert fires(cron, "UTC", after, expected[-1]) == expected
    assert fires(cron, "UTC", after, iso(until - timedelta(seconds=1))) == expected[:1]


def test_strictly_after_and_until_inclusive() -> None:
    t = make_trigger(cron="0 * * * *", every=None, timezone="UTC")
    assert t.next_fire(z("2026-01-01T01:00:00Z")) == z("2026-01-01T02:00Z")
    assert t.next_fire(z("2026-01-01T00:59:59.999999Z")) == z("2026-01-01T01:00Z")
    got = list(t.fires(z("2026-01-01T01:00Z"), z("2026-01-01T03:00Z")))
    assert got == [z("2026-01-01T02:00Z"), z("2026-01-01T03:00Z")]
    assert list(t.fires(z("2026-01-01T03:00Z"), z("2026-01-01T01:00Z"))) == []


def test_input_in_any_offset_output_in_utc() -> None:
    t = make_trigger(cron="30 1 * * *", every=None, timezone=NY)
    after = datetime(2026, 10, 31, 20, 0, tzinfo=timezone(timedelta(hours=-4)))  # 2026-11-01T00Z
    nxt = t.next_fire(after)
    assert nxt == z("2026-11-01T05:30Z") and nxt.tzinfo is UTC


def test_never_fires_returns_none() -> None:
    t = make_trigger(cron="0 0 30 2 *", every=None, timezone=NY)
    assert t.next_fire(z("2026-01-01T00:00Z")) is None
    assert list(t.fires(z("2026-01-01T00:00Z"), z("2030-01-01T00:00Z"))) == []
    t = make_trigger(cron="0 0 30 2 1", every=None, timezone="UTC")  # Mondays in February
    assert t.next_fire(z("2026-01-01T00:00Z")) == z("2026-02-02T00:00Z")


def test_naive_times_are_refused() -> None:
    t = make_trigger(cron="* * * * *", every=None, timezone="UTC")
    with pytest.raises(TimingError, match="after must be timezone-aware"):
        t.next_fire(datetime(2026, 1, 1))
    with pytest.raises(TimingError, match="until must be timezone-aware"):
        list(t.fires(z("2026-01-01T00:00Z"), datetime(2026, 1, 2)))


# --- every ---------------------------------------------------------------------------------------


def test_every_is_anchored_to_the_epoch_in_utc() -> None:
    t = make_trigger(cron=None, every=90.0, timezone=NY)
    assert t.fixed_time is False
    after = z("2026-03-08T06:59:00Z")
    nxt = t.next_fire(after)
    assert nxt is not None and int(nxt.timestamp()) % 90 == 0
    assert nxt - after <= timedelta(seconds=90) and nxt > after
    got = list(t.fires(z("2026-01-01T00:00Z"), z("2026-01-01T00:06Z")))
    assert [int(x.timestamp()) % 90 for x in got] == [0] * 4
    assert got[0] == z("2026-01-01T00:01:30Z")
    # same instants in any zone
    u = make_trigger(cron=None, every=90, timezone="Asia/Kathmandu")
    assert list(u.fires(z("2026-01-01T00:00Z"), z("2026-01-01T00:06Z"))) == got
    assert t.next_fire(z("2026-01-01T00:01:30Z")) == z("2026-01-01T00:03:00Z")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": None, "every": None, "timezone": "UTC"}, "exactly one of 'cron' and 'every'"),
        ({"cron": "* * * * *", "every": 60.0, "timezone": "UTC"}, "exactly one"),
        ({"cron": None, "every": 0.0, "timezone": "UTC"}, "every must be a whole number"),
        ({"cron": None, "every": 1.5, "timezone": "UTC"}, "every must be a whole number"),
        ({"cron": None, "every": float("inf"), "timezone": "UTC"}, "every must be"),
        ({"cron": None, "every": True, "timezone": "UTC"}, "every must be"),
        ({"cron": "61 * * * *", "every": None, "timezone": "UTC"}, "minute field: 61"),
        ({"cron": "* * * * *", "every": None, "timezone": "Nowhere"}, "unknown timezone"),
    ],
)
def test_make_trigger_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(TimingError) as info:
        make_trigger(**kwargs)
    assert message in str(info.value)


def test_trigger_is_immutable() -> None:
    t = make_trigger(cron="0 0 * * *", every=None, timezone=NY)
    assert isinstance(t, CronTrigger) and t.fixed_time is True and t.expr == parse_cron("0 0 * * *")
    with pytest.raises(AttributeError):
        t.timezone = "UTC"  # type: ignore[misc]


# --- dst_anomalies -------------------------------------------------------------------------------


def test_dst_anomaly_gap_message() -> None:
    t = make_trigger(cron="30 2 * * *", every=None, timezone=NY)
    found = dst_anomalies(t, z("2027-01-01T00:00Z"), z("2028-01-01T00:00Z"))
    assert len(found) == 1
    a = found[0]
    assert (a.local, a.kind, a.fires_at) == (
        datetime(2027, 3, 14, 2, 30),
        "gap",
        z("2027-03-14T07:00Z"),
    )
    assert a.message == (
        "2027-03-14 02:30 does not exist in America/New_York (DST gap); "
        "it fires once at 03:00 EDT (07:00Z)"
    )


def test_dst_anomaly_fold_message() -> None:
    t = make_trigger(cron="30 1 * * *", every=None, timezone=NY)
    found = dst_anomalies(t, z("2026-01-01T00:00Z"), z("2027-01-01T00:00Z"))
    assert [(a.local, a.kind, a.fires_at) for a in found] == [
        (datetime(2026, 11, 1, 1, 30), "fold", z("2026-11-01T05:30Z"))
    ]
    assert found[0].message == (
        "2026-11-01 01:30 occurs twice in America/New_York (DST fold); "
        "it fires once, at its first occurrence, 01:30 EDT (05:30Z)"
    )


def test_dst_anomalies_only_for_fixed_time_cron() -> None:
    span = (z("2026-01-01T00:00Z"), z("2027-01-01T00:00Z"))
    for cron, every in (("30 * * * *", None), ("* 2 * * *", None), (None, 60.0)):
        t = make_trigger(cron=cron, every=every, timezone=NY)
        assert dst_anomalies(t, *span) == []
    t = make_trigger(cron="0,30 1,2 * * *", every=None, timezone=NY)
    kinds = [(a.local.strftime("%m-%d %H:%M"), a.kind) for a in dst_anomalies(t, *span)]
    assert kinds == [
        ("03-08 02:00", "gap"),
        ("03-08 02:30", "gap"),
        ("11-01 01:00", "fold"),
        ("11-01 01:30", "fold"),
    ]
    assert dst_anomalies(make_trigger(cron="0 12 * * *", every=None, timezone=NY), *span) == []


# --- a full year (its speed is measured by benchmarks/history_year.py, never asserted here) -------


def test_minutely_year_in_new_york_is_complete() -> None:
    t = make_trigger(cron="* * * * *", every=None, timezone=NY)
    got = list(t.fires(z("2026-01-01T00:00Z"), z("2027-01-01T00:00Z")))
    assert len(got) == 525_600  # every UTC minute: elapsed-time loses and repeats nothing in UTC
    assert got[0] == z("2026-01-01T00:01Z") and got[-1] == z("2027-01-01T00:00Z")
    assert len(set(got)) == len(got)
