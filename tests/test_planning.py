"""Decisions as a table of cases: no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronkeeper.planning import ALWAYS_PAUSED, Decision, Outcome, Reason, idempotency_key, plan
from cronkeeper.schedule.model import Misfire, Overlap, ScheduleSpec

T0 = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
E, S = Outcome.EMITTED, Outcome.SKIPPED


def spec(misfire=Misfire.SKIP, overlap=Overlap.SKIP, grace=60.0, limit=3600.0) -> ScheduleSpec:
    return ScheduleSpec(
        name="s", timezone="UTC", misfire=misfire, every=600.0, overlap=overlap, task="t.x",
        grace=grace, catch_up_limit=limit,
    )


def minutes(*ms: int) -> list[datetime]:
    return [T0 + timedelta(minutes=m) for m in ms]


def outcomes(decisions: list[Decision]) -> list[tuple[int, Outcome, Reason | None]]:
    return [(int((d.scheduled_for - T0).total_seconds() // 60), d.outcome, d.reason) for d in decisions]


@pytest.mark.parametrize(
    ("misfire", "due", "now_min", "expected"),
    [
        # on time: emitted whatever the policy
        (Misfire.SKIP, [0], 0.5, [(0, E, None)]),
        (Misfire.CATCH_UP, [0], 0.5, [(0, E, None)]),
        (Misfire.LATEST, [0], 0.5, [(0, E, None)]),
        # skip: late beyond grace -> misfire
        (Misfire.SKIP, [0, 10, 20], 20.5, [(0, S, Reason.MISFIRE), (10, S, Reason.MISFIRE), (20, E, None)]),
        (Misfire.SKIP, [0, 10], 12, [(0, S, Reason.MISFIRE), (10, S, Reason.MISFIRE)]),
        # catch_up: within the limit (60 min) emitted oldest first, older skipped
        (Misfire.CATCH_UP, [0, 30, 60, 90], 95, [(0, S, Reason.MISFIRE), (30, S, Reason.MISFIRE), (60, E, None), (90, E, None)]),
        # latest: the newest late period stands for the rest
        (Misfire.LATEST, [0, 10, 20], 25, [(0, S, Reason.COALESCED), (10, S, Reason.COALESCED), (20, E, None)]),
        # latest with an on-time period: the late ones are all coalesced
        (Misfire.LATEST, [0, 10, 20], 20.5, [(0, S, Reason.COALESCED), (10, S, Reason.COALESCED), (20, E, None)]),
        (Misfire.LATEST, [], 5, []),
    ],
)
def test_misfire_policies(misfire, due, now_min, expected):
    now = T0 + timedelta(minutes=now_min)
    assert outcomes(plan(spec(misfire), minutes(*due), now, paused=(), busy=False)) == expected


def test_grace_boundary_is_inclusive():
    due = minutes(0)
    assert plan(spec(), due, T0 + timedelta(seconds=60), paused=(), busy=False)[0].outcome is E
    late = plan(spec(), due, T0 + timedelta(seconds=60.001), paused=(), busy=False)[0]
    assert (late.outcome, late.reason) == (S, Reason.MISFIRE)


def test_paused_wins_over_everything():
    decisions = plan(spec(Misfire.CATCH_UP), minutes(0, 10), T0 + timedelta(minutes=10), paused=ALWAYS_PAUSED, busy=True)
    assert outcomes(decisions) == [(0, S, Reason.PAUSED), (10, S, Reason.PAUSED)]


@pytest.mark.parametrize(
    ("overlap", "busy", "expected"),
    [
        (Overlap.SKIP, True, [(0, S, Reason.OVERLAP)]),
        (Overlap.SKIP, False, [(0, E, None)]),
        (Overlap.ALLOW, True, [(0, E, None)]),
        (Overlap.SERIAL, True, [(0, E, None)]),
    ],
)
def test_overlap_policies(overlap, busy, expected):
    assert outcomes(plan(spec(overlap=overlap), minutes(0), T0, paused=(), busy=busy)) == expected


def test_overlap_does_not_turn_a_misfire_into_an_overlap():
    decisions = plan(spec(), minutes(0, 10), T0 + timedelta(minutes=10), paused=(), busy=True)
    assert outcomes(decisions) == [(0, S, Reason.MISFIRE), (10, S, Reason.OVERLAP)]


def test_catch_up_periods_of_one_decision_are_not_judged_against_each_other():
    decisions = plan(spec(Misfire.CATCH_UP), minutes(0, 10, 20), T0 + timedelta(minutes=20), paused=(), busy=False)
    assert [d.outcome for d in decisions] == [E, E, E]


def test_idempotency_key_format():
    assert idempotency_key("nightly-invoices", datetime(2026, 3, 8, 7, tzinfo=UTC)) == (
        "nightly-invoices@2026-03-08T07:00:00Z"
    )


def test_a_key_names_its_period_and_a_manual_key_names_none():
    from cronkeeper.planning import idempotency_key, key_stamp, period_of_key  # noqa: PLC0415

    at = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    key = idempotency_key("nightly-invoices", at)
    assert key == "nightly-invoices@2026-03-08T07:00:00Z" == f"nightly-invoices@{key_stamp(at)}"
    assert period_of_key(key) == ("nightly-invoices", at)
    assert period_of_key("a@b@2026-03-08T07:00:00Z") == ("a@b", at)
    assert period_of_key("nightly@manual:2026-03-08T07:00:00.123456Z") is None
    assert period_of_key("no-at-sign") is None


# -- pause judged per period at its due instant (SPEC §4) ------------------------------------------
def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


@pytest.mark.parametrize(
    ("misfire", "due", "now_min", "spans", "expected"),
    [
        # due before the pause, decided after it (a tick a moment late): the normal policy
        (Misfire.SKIP, [0], 0.5, [(at(0.1), None)], [(0, E, None)]),
        (Misfire.SKIP, [0], 5, [(at(0.1), None)], [(0, S, Reason.MISFIRE)]),
        # due inside the span, decided after the resume: skipped, paused
        (Misfire.SKIP, [0], 0.5, [(at(-1), at(0.1))], [(0, S, Reason.PAUSED)]),
        (Misfire.CATCH_UP, [0, 10, 20, 30], 31, [(at(5), at(25))],
         [(0, E, None), (10, S, Reason.PAUSED), (20, S, Reason.PAUSED), (30, E, None)]),
        # an open span: every period due from its start on
        (Misfire.CATCH_UP, [0, 10, 20], 21, [(at(5), None)],
         [(0, E, None), (10, S, Reason.PAUSED), (20, S, Reason.PAUSED)]),
        # paused since ever (an older release's pause)
        (Misfire.CATCH_UP, [0, 10], 11, [(None, None)], [(0, S, Reason.PAUSED), (10, S, Reason.PAUSED)]),
        (Misfire.CATCH_UP, [0, 10], 11, [(None, at(5))], [(0, S, Reason.PAUSED), (10, E, None)]),
        # edges: due at paused_at is paused, due at resumed_at is not
        (Misfire.CATCH_UP, [0, 10, 20], 21, [(at(10), at(20))],
         [(0, E, None), (10, S, Reason.PAUSED), (20, E, None)]),
        # two spans
        (Misfire.CATCH_UP, [0, 10, 20, 30, 40], 41, [(at(0), at(10)), (at(30), at(31))],
         [(0, S, Reason.PAUSED), (10, E, None), (20, E, None), (30, S, Reason.PAUSED), (40, E, None)]),
        # latest: the paused periods are not coalesced into the emitted one, nor stand for it
        (Misfire.LATEST, [0, 10, 20], 25, [(at(15), None)],
         [(0, S, Reason.COALESCED), (10, E, None), (20, S, Reason.PAUSED)]),
        # a span that holds none of the periods changes nothing
        (Misfire.CATCH_UP, [0, 10], 11, [(at(-10), at(-5))], [(0, E, None), (10, E, None)]),
    ],
)
def test_pause_is_judged_at_each_periods_due_instant(misfire, due, now_min, spans, expected):
    now = T0 + timedelta(minutes=now_min)
    assert outcomes(plan(spec(misfire), minutes(*due), now, paused=tuple(spans), busy=False)) == expected


def test_a_period_due_before_a_pause_is_judged_for_overlap_as_normal():
    decisions = plan(spec(Misfire.CATCH_UP), minutes(0, 10), at(11), paused=((at(5), None),),
                     busy=True)
    assert outcomes(decisions) == [(0, S, Reason.OVERLAP), (10, S, Reason.PAUSED)]
