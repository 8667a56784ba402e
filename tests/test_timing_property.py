"""fires()/next_fire() against a brute-force reference around real DST transitions.

The reference walks every UTC minute (every second for 6-field crons, in a narrower window) and
applies SPEC §4 from first principles: an instant's wall time matches the cron; elapsed-time crons
fire at every matching instant; fixed-time crons fire a local time at its first occurrence, and a
local time that never occurs at the first instant whose wall time is past it (the gap's end).
"""

from __future__ import annotations

import calendar
import functools
import hashlib
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronkeeper.timing import CronExpr, TimingError, make_trigger, parse_cron

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
    length = calendar.monthrange(when.year, when.month)[1]
    weekday = when.isoweekday() % 7
    dom = when.day in e.days or any(when.day == length - n for n in e.last_days)
    dow = (
        weekday in e.weekdays
        or (weekday in e.last_weekdays and when.day + 7 > length)
        or (weekday, (when.day - 1) // 7 + 1) in e.nth_weekdays
    )
    return (dom and dow) if (e.dom_star or e.dow_star) else (dom or dow)


def reference(cron: str, name: str, lo: int, hi: int, step: int, schedule: str = "s") -> list[int]:
    """Fire instants t with lo <= t <= hi (t a multiple of step)."""
    zone = ZoneInfo(name)
    e = parse_cron(cron, schedule)
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


MINUTE = st.sampled_from(["*", "*/15", "0", "30", "0,30", "15-45/15", "*/7", "45", "59", "H",
                          "H/15", "H(0-29)", "H(30-59)/10"])
HOUR = st.sampled_from(["*", "1", "2", "0-3", "1,2", "*/2", "0-23/5", "23", "3", "H(1-2)",
                        "H(0-3)/2"])
DOM = st.sampled_from(["*", "*", "1", "*/2", "8-14", "31", "1-31/3", "L", "L-1", "1,L", "L-6",
                       "H"])
MONTH = st.sampled_from(["*", "*", "3,4", "10,11", "1-12/2"])
DOW = st.sampled_from(["*", "*", "0", "7", "1-5", "sun", "6", "*/3", "0L", "sun#1", "7#2,5L",
                       "SAT#5", "H"])
SECOND = st.sampled_from(["0", "*/20", "15,45", "*", "59", "H", "H/20"])
SCHEDULE = st.sampled_from(["s", "nightly-invoices", "tenant-0001", "a.b_c-9"])


def _check(cron: str, name: str, lo: int, hi: int, step: int, shift: int,
           schedule: str = "s") -> None:
    expected = reference(cron, name, lo, hi, step, schedule)
    trigger = make_trigger(cron=cron, every=None, timezone=name, name=schedule)
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
    _check(cron, name, lo, hi, 60, shift, data.draw(SCHEDULE))


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
    _check(cron, name, lo, hi, 1, shift, data.draw(SCHEDULE))


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


# --- H, L and #, against the same independent parser, extended from docs/schedules.md -----------

_FIELD_NAMES = ["minute", "hour", "day-of-month", "month", "day-of-week"]
_H_RANGES = {2: (1, 28), 4: (0, 6)}  # bare H: days every month has, Sunday once


def _documented_hash(name: str, field: int) -> int:
    digest = hashlib.sha256(f"{name} {_FIELD_NAMES[field]}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def independent_extended(text: str, field: int, name: str) -> tuple[set[int], set[tuple]]:
    """(plain values, L/# items) of a field that may hold H, L and #."""
    values: set[int] = set()
    specials: set[tuple] = set()
    for item in text.split(","):
        upper = item.upper()
        if upper.startswith("H"):
            low, high = _H_RANGES.get(field, _BOUNDS[field])
            body, _, step = item[1:].partition("/")
            if body:
                a, b = body[1:-1].split("-")
                low, high = _number(a, field), _number(b, field)
                if field == 4 and high == 0 and low > 0:
                    high = 7
            hashed = _documented_hash(name, field)
            if step:
                values.update(range(low + hashed % int(step), high + 1, int(step)))
            else:
                values.add(low + hashed % (high - low + 1))
        elif field == 2 and upper.startswith("L"):
            specials.add((int(item[2:]) if "-" in item else 0,))
        elif field == 4 and "#" in item:
            day, week = item.split("#")
            specials.add((_number(day, 4) % 7, int(week)))
        elif field == 4 and upper.endswith("L"):
            specials.add((_number(item[:-1], 4) % 7,))
        else:
            values |= independent_field(item, field)
    if field == 4 and 7 in values:
        values = (values - {7}) | {0}
    return values, specials


def _extended_item(field: int) -> st.SearchStrategy[str]:
    low, high = _BOUNDS[field]
    if field in _NAMES:
        names = _NAMES[field]
        value = st.integers(low, high).map(str) | st.sampled_from(names + [n.upper() for n in names])
    else:
        value = st.integers(low, high).map(str)

    def ordered(pair: tuple[str, str]) -> bool:
        a, b = (_number(x, field) for x in pair)
        return a <= b or (field == 4 and b == 0 and a > 0)

    def size(pair: tuple[str, str]) -> int:
        a, b = (_number(x, field) for x in pair)
        return (7 if field == 4 and b == 0 and a > 0 else b) - a + 1

    letter = st.sampled_from(["H", "h"])
    ranged = st.tuples(value, value).filter(ordered)
    span = _H_RANGES.get(field, _BOUNDS[field])
    hashed = st.one_of(
        letter,
        st.tuples(letter, ranged).map(lambda t: f"{t[0]}({t[1][0]}-{t[1][1]})"),
        st.tuples(letter, st.integers(1, span[1] - span[0] + 1)).map(lambda t: f"{t[0]}/{t[1]}"),
        ranged.flatmap(lambda pair: st.integers(1, size(pair)).map(
            lambda n: f"H({pair[0]}-{pair[1]})/{n}")),
    )
    options = [_item(field), hashed]
    if field == 2:
        options.append(st.just("L") | st.integers(0, 30).map(lambda n: f"L-{n}"))
    if field == 4:
        suffix = st.sampled_from(["L", "l"])
        options.append(st.tuples(value, suffix).map("".join))
        options.append(st.tuples(value, st.integers(1, 5)).map(lambda t: f"{t[0]}#{t[1]}"))
    return st.one_of(*options)


@settings(max_examples=400, deadline=None)
@given(
    st.tuples(*(st.lists(_extended_item(f), min_size=1, max_size=3).map(",".join)
                for f in range(5))),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=40),
)
def test_h_l_and_hash_fields_match_an_independent_parser(fields: tuple[str, ...], name: str) -> None:
    e = parse_cron(" ".join(fields), name)
    expected = [independent_extended(text, f, name) for f, text in enumerate(fields)]
    assert [set(e.minutes), set(e.hours), set(e.days), set(e.months), set(e.weekdays)] == [
        values for values, _ in expected
    ], fields
    assert {(n,) for n in e.last_days} == expected[2][1], fields
    assert {(d,) for d in e.last_weekdays} | set(e.nth_weekdays) == expected[4][1], fields


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789*/-,LlHhW#?()@ \tmonfrijulsat\u0661\uff10\u00a0", max_size=30),
       st.sampled_from([None, "s", "tenant-0042"]))
def test_any_text_parses_or_says_why(expr: str, name: str | None) -> None:
    """Hostile input: a CronExpr or a TimingError, never another exception."""
    try:
        parse_cron(expr, name)
    except TimingError as exc:
        assert str(exc)
