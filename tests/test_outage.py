"""The outage report (cronkeeper.outage): what a process says while the database is away, as a
table of failures and successes at given instants. Pure: no database, no clock."""

from __future__ import annotations

import pytest

from cronkeeper.outage import Notice, OutageReport, Repeats, kind_of, where

FULL = "too many clients"
GONE = "terminating connection due to administrator command"


def said(events: list[tuple[float, str | None]], every: float = 60.0) -> list[tuple[float, Notice]]:
    """Feed (instant, kind) failures and (instant, None) successes; return what was said."""
    report = OutageReport(every)
    out = []
    for now, kind in events:
        notice = report.recovered(now) if kind is None else report.failed(now, kind)
        if notice is not None:
            out.append((now, notice))
    return out


def test_the_first_failure_is_said_and_the_same_kind_then_counted_silently():
    # the daemon's backoff: 0.2 s doubling to 5 s, eight tries in 20 s
    tries = [0.0, 0.2, 0.6, 1.4, 3.0, 6.2, 11.2, 16.2]
    assert said([(t, FULL) for t in tries]) == [(0.0, Notice(first=True, lasted=0.0, failures=1))]


def test_the_same_kind_is_said_again_after_a_minute_with_the_count():
    events = [(t, FULL) for t in range(0, 130, 5)]  # every 5 s for over two minutes
    assert said(events) == [
        (0, Notice(first=True, lasted=0.0, failures=1)),
        (60, Notice(first=False, lasted=60.0, failures=13)),
        (120, Notice(first=False, lasted=120.0, failures=25)),
    ]


def test_a_minute_counts_from_the_last_line_said_not_from_the_outage_start():
    events = [(0.0, FULL), (59.9, FULL), (60.0, FULL), (119.9, FULL), (120.0, FULL)]
    assert [t for t, _ in said(events)] == [0.0, 60.0, 120.0]


def test_a_new_kind_is_said_at_once_and_each_kind_keeps_its_own_minute():
    events = [(0.0, GONE), (0.2, FULL), (0.6, FULL), (1.0, GONE), (30.0, FULL), (61.0, GONE),
              (61.0, FULL)]
    assert said(events) == [
        (0.0, Notice(first=True, lasted=0.0, failures=1)),
        (0.2, Notice(first=False, lasted=0.2, failures=2)),
        (61.0, Notice(first=False, lasted=61.0, failures=6)),
        (61.0, Notice(first=False, lasted=61.0, failures=7)),
    ]


def test_recovery_is_said_once_with_how_long_it_lasted_and_then_nothing():
    events = [(10.0, FULL), (10.5, FULL), (12.0, FULL), (25.0, None), (26.0, None)]
    assert said(events)[1:] == [(25.0, Notice(first=False, lasted=15.0, failures=3))]


def test_a_success_with_no_outage_says_nothing():
    report = OutageReport()
    assert report.recovered(5.0) is None
    assert not report.down


def test_after_recovery_the_next_failure_opens_a_new_outage_said_at_once():
    events = [(0.0, FULL), (1.0, None), (2.0, FULL), (2.5, FULL)]
    assert said(events) == [
        (0.0, Notice(first=True, lasted=0.0, failures=1)),
        (1.0, Notice(first=False, lasted=1.0, failures=1)),
        (2.0, Notice(first=True, lasted=0.0, failures=1)),
    ]


def test_down_follows_failures_and_successes():
    report = OutageReport()
    report.failed(0.0, FULL)
    assert report.down
    report.failed(1.0, FULL)
    assert report.down
    report.recovered(2.0)
    assert not report.down


@pytest.mark.parametrize(("a", "b", "same"), [
    ('connection to server at "127.0.0.1", port 5432 failed: FATAL:  sorry, too many clients',
     'connection to server at "127.0.0.1", port 5433 failed: FATAL:  sorry, too many clients',
     True),
    ("canceling statement due to lock timeout (pid 4711)",
     "canceling statement due to lock timeout (pid 99)", True),
    ("sorry, too many clients already", GONE, False),
])
def test_kind_of_ignores_numbers_only(a, b, same):
    assert (kind_of(a) == kind_of(b)) is same


def _raised(message: str, line: int = 0) -> BaseException:
    """An exception raised at one of two lines (so that its ``where`` differs)."""
    try:
        if line == 0:
            raise ValueError(message)
        raise ValueError(message)
    except ValueError as exc:
        return exc


def test_repeats_says_an_error_with_its_traceback_once_then_once_a_minute():
    repeats = Repeats()
    got = [(t, repeats.failed("step", _raised(f"job {t}"), t)) for t in (0.0, 1.0, 59.0, 60.0,
                                                                        61.0, 121.0)]
    assert [(t, n) for t, n in got if n is not None] == [
        (0.0, Notice(first=True, lasted=0.0, failures=1)),
        (60.0, Notice(first=False, lasted=60.0, failures=4)),
        (121.0, Notice(first=False, lasted=121.0, failures=6)),
    ]


def test_repeats_tells_errors_apart_by_step_type_and_line_not_message():
    repeats = Repeats()
    assert repeats.failed("beat", _raised("a"), 0.0).first
    assert repeats.failed("beat", _raised("b"), 1.0) is None  # the same error, another message
    assert repeats.failed("depose", _raised("a"), 2.0).first  # another step
    assert repeats.failed("beat", _raised("a", line=1), 3.0).first  # another line
    assert repeats.failed("beat", KeyError("a"), 4.0).first  # another type (never raised)
    assert where(_raised("a")) != where(_raised("a", line=1))
    assert where(_raised("a")).startswith(__file__)
    assert where(KeyError("a")) == ""
