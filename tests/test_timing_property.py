"""fires()/next_fire() against a brute-force reference around real DST transitions.

The reference walks every UTC minute (every second for 6-field crons, in a narrower window) and
applies SPEC §4 from first principles: an instant's wall time matches the cron; elapsed-time crons
fire at every matching instant; fixed-time crons fire a local time at its first occurrence, and a
local time that never occurs at the first instant whose wall time is past it (the gap's end).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronkeeper.timing import CronExpr, make_trigger, parse_cron

ZONES = (
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",
    "America/Sao_Paulo",
    "Asia/Kathmandu",
    "Pacific/Apia",
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NAIVE_EPOCH = datetime(1970, 1, 1)


def offset(zone: ZoneInfo, t: int) -> int:
    return int(datetime.fromtimestamp(t, zone).utcoffset().total_seconds())


def wall(zone: ZoneInfo, t: int) -> int:
    """Naive local seconds (since 1970-01-01T00:00 local) of the instant t."""
    return t + offset(zone, t)


@functools.cache
def centres(name: str) -> tuple[int, ...]:
    """Instants of each offset change in 2026-2027, found by scanning hours then minutes; zones
    without any get four fixed dates instead."""
    zone = ZoneInfo(name)
    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())
    end = int(datetime(2028, 1, 1, tzinfo=UTC).timestamp())
    found = []
    for t in range(start, end, 3600):
        if offset(zone, t) != offset(zone, t + 3600):
            found.append(
                next(m for m in range(t, t + 3601, 60) if offset(zone, m) != offset(zone, t))
            )
    if not found:
        found = [start + k * 190 * 86400 for k in range(4)]
    return tuple(found)


def matches(e: CronExpr, local: int) -> bool:
    when = NAIVE_EPOCH + timedelta(seconds=local)
    if (
        when.second not in e.seconds
        or when.minute not in e.minutes
        or when.hour not in e.hours
        or when.month not in e.months
    ):
        return False
    dom = when.day in e.days
    dow = when.isoweekday() % 7 in e.weekdays
    return (dom and dow) if (e.dom_star or e.dow_star) else (dom or dow)


def reference(cron: str, name: str, lo: int, hi: int, step: int) -> list[int]:
    """Fire instants t with lo <= t <= hi (t a multiple of step)."""
    zone = ZoneInfo(name)
    e = parse_cron(cron)
    fields = cron.split()
    elapsed = fields[-5].startswith("*") or fields[-4].startswith("*")
    walk = range(lo, hi + 1, step)
    if elapsed:
        return [t for t in walk if matches(e, wall(zone, t))]
    offsets = {offset(zone, t) for t in range(lo - 2 * 86400, hi + 2 * 86400, 900)}
    out = set()
    for t in walk:  # first occurrences
        local = wall(zone, t)
        if matches(e, local):
            occurrences = [local - o for o in offsets if wall(zone, local - o) == local]
            if t == min(occurrences):
                out.add(t)
    for local in range(lo + min(offsets), hi + max(offsets) + 1, step):  # gaps
        if matches(e, local) and not any(wall(zone, local - o) == local for o in offsets):
            t = local - max(offsets)
            while wall(zone, t) <= local:
                t += step
            if lo <= t <= hi:
                out.add(t)
    return sorted(out)


MINUTE = st.sampled_from(["*", "*/15", "0", "30", "0,30", "15-45/15", "*/7", "45", "59"])
HOUR = st.sampled_from(["*", "1", "2", "0-3", "1,2", "*/2", "0-23/5", "23", "3"])
DOM = st.sampled_from(["*", "*", "1", "*/2", "8-14", "31", "1-31/3"])
MONTH = st.sampled_from(["*", "*", "3,4", "10,11", "1-12/2"])
DOW = st.sampled_from(["*", "*", "0", "7", "1-5", "sun", "6", "*/3"])
SECOND = st.sampled_from(["0", "*/20", "15,45", "*", "59"])


def _check(cron: str, name: str, lo: int, hi: int, step: int, shift: int) -> None:
    expected = reference(cron, name, lo, hi, step)
    trigger = make_trigger(cron=cron, every=None, timezone=name)
    after = EPOCH + timedelta(seconds=lo - 1)
    got = [
        int((t - EPOCH).total_seconds())
        for t in trigger.fires(after, EPOCH + timedelta(seconds=hi))
    ]
    assert got == expected, (cron, name)
    # next_fire from a point inside the window, not on a whole second
    inside = lo + shift
    later = [t for t in expected if t > inside]
    nxt = trigger.next_fire(EPOCH + timedelta(seconds=inside, microseconds=500_000))
    if later:
        assert nxt is not None and int((nxt - EPOCH).total_seconds()) == later[0], (cron, name)
    else:
        assert nxt is None or int((nxt - EPOCH).total_seconds()) > hi, (cron, name)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.tuples(MINUTE, HOUR, DOM, MONTH, DOW).map(" ".join),
    st.sampled_from(ZONES),
    st.data(),
)
def test_five_field_crons_match_the_reference(cron: str, name: str, data: st.DataObject) -> None:
    centre = data.draw(st.sampled_from(centres(name)))
    lo = centre - 30 * 3600
    hi = centre + 30 * 3600
    lo -= lo % 60
    hi -= hi % 60
    shift = data.draw(st.integers(0, hi - lo))
    _check(cron, name, lo, hi, 60, shift)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.tuples(SECOND, MINUTE, HOUR).map(lambda f: " ".join(f) + " * * *"),
    st.sampled_from(ZONES),
    st.data(),
)
def test_six_field_crons_match_the_reference(cron: str, name: str, data: st.DataObject) -> None:
    centre = data.draw(st.sampled_from(centres(name)))
    lo, hi = centre - 40 * 60, centre + 40 * 60
    shift = data.draw(st.integers(0, hi - lo))
    _check(cron, name, lo, hi, 1, shift)


def test_the_reference_applies_the_acceptance_rules() -> None:
    """The reference itself agrees with SPEC §4's two worked examples."""
    lo = int(datetime(2026, 10, 31, tzinfo=UTC).timestamp())
    got = reference("30 1 * * *", "America/New_York", lo, lo + 3 * 86400, 60)
    assert [datetime.fromtimestamp(t, UTC).isoformat() for t in got] == [
        "2026-10-31T05:30:00+00:00",
        "2026-11-01T05:30:00+00:00",
        "2026-11-02T06:30:00+00:00",
    ]
    lo = int(datetime(2026, 3, 7, tzinfo=UTC).timestamp())
    got = reference("30 2 * * *", "America/New_York", lo, lo + 3 * 86400, 60)
    assert [datetime.fromtimestamp(t, UTC).isoformat() for t in got] == [
        "2026-03-07T07:30:00+00:00",
        "2026-03-08T07:00:00+00:00",
        "2026-03-09T06:30:00+00:00",
    ]


# --- the field parser against an independent one -------------------------------------------------
# The references above reuse parse_cron's field sets; this one does not. Written from crontab(5)
# and cronie's entry.c (get_list / get_range): items split on ',', a range 'a-b' or '*', an
# optional '/step', names case-insensitive, day-of-week 7 is Sunday and a range may end on it
# ('fri-sun' = 5-7). Issue 9 §4's differential run found no arithmetic error; this keeps it so.

_NAMES = {
    3: ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
    4: ["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
}
_BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def _number(text: str, field: int) -> int:
    if text.isdigit():
        return int(text)
    names = _NAMES[field]
    return names.index(text.lower()) + (1 if field == 3 else 0)


def independent_field(text: str, field: int) -> set[int]:
    low, high = _BOUNDS[field]
    out: set[int] = set()
    for item in text.split(","):
        body, _, step = item.partition("/")
        if body == "*":
            first, last = low, high
        elif "-" in body:
            a, b = body.split("-")
            first, last = _number(a, field), _number(b, field)
            if field == 4 and last == 0 and first > 0:  # "0-0" is Sunday alone
                last = 7
        else:
            first = last = _number(body, field)
        out.update(range(first, last + 1, int(step) if step else 1))
    if field == 4 and 7 in out:
        out = (out - {7}) | {0}
    return out


def _item(field: int) -> st.SearchStrategy[str]:
    low, high = _BOUNDS[field]
    value = st.integers(low, high).map(str)
    if field in _NAMES:
        names = _NAMES[field]
        value = value | st.sampled_from(names + [n.upper() for n in names])

    def ordered(pair: tuple[str, str]) -> bool:
        a, b = (_number(x, field) for x in pair)
        return a <= b or (field == 4 and b == 0 and a > 0)

    ranged = st.tuples(value, value).filter(ordered).map("-".join)
    step = st.integers(1, high - low).map(str)
    return st.one_of(
        value,
        ranged,
        st.just("*"),
        st.tuples(st.just("*"), step).map("/".join),
        st.tuples(ranged, step).map("/".join),
    )


@settings(max_examples=400, deadline=None)
@given(st.tuples(*(st.lists(_item(f), min_size=1, max_size=3).map(",".join) for f in range(5))))
def test_field_sets_match_an_independent_parser(fields: tuple[str, ...]) -> None:
    e = parse_cron(" ".join(fields))
    got = [set(e.minutes), set(e.hours), set(e.days), set(e.months), set(e.weekdays)]
    assert got == [independent_field(text, f) for f, text in enumerate(fields)], fields
