"""The cron grammar (SPEC §4): every feature and every error, as tables."""

from __future__ import annotations

import pytest

from cronkeeper.timing import CronExpr, TimingError, parse_cron

ALL_MIN = tuple(range(60))
ALL_HOUR = tuple(range(24))
ALL_DOM = tuple(range(1, 32))
ALL_MONTH = tuple(range(1, 13))
ALL_DOW = tuple(range(7))


def fields(e: CronExpr) -> tuple:
    return (e.seconds, e.minutes, e.hours, e.days, e.months, e.weekdays)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("* * * * *", ((0,), ALL_MIN, ALL_HOUR, ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("30 2 * * *", ((0,), (30,), (2,), ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("0-10/5 1-3 * * *", ((0,), (0, 5, 10), (1, 2, 3), ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("*/15 */6 * * *", ((0,), (0, 15, 30, 45), (0, 6, 12, 18), ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("5,1,3 0 1,15 * *", ((0,), (1, 3, 5), (0,), (1, 15), ALL_MONTH, ALL_DOW)),
        ("0 0 * jan,JUL,Dec *", ((0,), (0,), (0,), ALL_DOM, (1, 7, 12), ALL_DOW)),
        ("0 0 * mar-may *", ((0,), (0,), (0,), ALL_DOM, (3, 4, 5), ALL_DOW)),
        ("0 0 * * mon-fri", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (1, 2, 3, 4, 5))),
        ("0 0 * * SUN", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (0,))),
        ("0 0 * * 0", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (0,))),
        ("0 0 * * 7", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (0,))),
        ("0 0 * * 5-7", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (0, 5, 6))),
        ("0 0 * * fri-sun", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (0, 5, 6))),
        ("0 0 * * 1-7/2", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (0, 1, 3, 5))),
        ("0 0 * * */2", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (0, 2, 4, 6))),
        ("07 08 09 10 *", ((0,), (7,), (8,), (9,), (10,), ALL_DOW)),
        ("  0\t0  * * *  ", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("*/20 30 2 * * *", ((0, 20, 40), (30,), (2,), ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("5,10 * * * * *", ((5, 10), ALL_MIN, ALL_HOUR, ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("@hourly", ((0,), (0,), ALL_HOUR, ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("@daily", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("@midnight", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, ALL_DOW)),
        ("@weekly", ((0,), (0,), (0,), ALL_DOM, ALL_MONTH, (0,))),
        ("@monthly", ((0,), (0,), (0,), (1,), ALL_MONTH, ALL_DOW)),
        ("@yearly", ((0,), (0,), (0,), (1,), (1,), ALL_DOW)),
        ("@annually", ((0,), (0,), (0,), (1,), (1,), ALL_DOW)),
    ],
)
def test_parse_values(expr: str, expected: tuple) -> None:
    assert fields(parse_cron(expr)) == expected


@pytest.mark.parametrize(
    ("expr", "has_seconds", "fixed_time", "day_or"),
    [
        ("* * * * *", False, False, False),
        ("*/15 2 * * *", False, False, False),
        ("30 * * * *", False, False, False),
        ("30 */2 * * *", False, False, False),
        ("@hourly", False, False, False),
        ("30 2 * * *", False, True, False),
        ("0-59 0-23 * * *", False, True, False),  # starts with a digit: fixed-time (cronie)
        ("@daily", False, True, False),
        ("@weekly", False, True, False),
        ("0 0 1 * 1", False, True, True),
        ("0 0 */2 * 1", False, True, False),  # '*/2' counts as '*': AND
        ("0 0 1 * */2", False, True, False),
        ("* 30 2 * * *", True, True, False),  # seconds '*' does not make it elapsed-time
        ("0 * 2 * * *", True, False, False),
    ],
)
def test_flags(expr: str, has_seconds: bool, fixed_time: bool, day_or: bool) -> None:
    e = parse_cron(expr)
    assert (e.has_seconds, e.fixed_time, e.day_or) == (has_seconds, fixed_time, day_or)


@pytest.mark.parametrize(
    ("expr", "never"),
    [
        ("0 0 30 2 *", True),
        ("0 0 31 4,6,9,11 *", True),
        ("0 0 31 4,6 *", True),
        ("0 0 30,31 2 *", True),
        ("0 0 30 2 1", False),  # OR rule: Mondays in February
        ("0 0 29 2 *", False),  # leap years
        ("0 0 31 4,5 *", False),
        ("0 0 */30 2 *", False),  # {1, 31}: Feb 1
        ("0 0 31 2 */2", True),  # '*/2' weekday counts as '*': AND, and Feb 31 never exists
        ("* * * * *", False),
    ],
)
def test_never_fires(expr: str, never: bool) -> None:
    assert parse_cron(expr).never_fires() is never


def test_frozen_and_cached() -> None:
    e = parse_cron("0 0 * * *")
    with pytest.raises(AttributeError):
        e.minutes = (1,)  # type: ignore[misc]
    assert parse_cron("0 0 * * *") == e
    assert e.source == "0 0 * * *"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "cron expression is empty"),
        ("   ", "cron expression is empty"),
        ("* * * *", "cron expression has 4 fields; expected 5"),
        ("* * * * * * *", "cron expression has 7 fields; expected 5"),
        ("0 25 * * *", "hour field: 25 is out of range 0-23"),
        ("60 0 * * *", "minute field: 60 is out of range 0-59"),
        ("0 0 0 * *", "day-of-month field: 0 is out of range 1-31"),
        ("0 0 32 * *", "day-of-month field: 32 is out of range 1-31"),
        ("0 0 * 13 *", "month field: 13 is out of range 1-12"),
        ("0 0 * 0 *", "month field: 0 is out of range 1-12"),
        ("0 0 * * 8", "day-of-week field: 8 is out of range 0-7"),
        ("60 0 0 * * *", "second field: 60 is out of range 0-59"),
        ("0 5-1 * * *", "hour field: range '5-1' is reversed (5 > 1)"),
        ("0 5-1/2 * * *", "hour field: range '5-1/2' is reversed (5 > 1)"),
        ("*/0 * * * *", "minute field: step in '*/0' is zero"),
        ("0 1-5/0 * * *", "hour field: step in '1-5/0' is zero"),
        ("5/15 * * * *", "minute field: '5/15': a step needs a range or '*'"),
        ("*/x * * * *", "minute field: step 'x' in '*/x' is not a number"),
        ("*/ * * * *", "minute field: step '' in '*/' is not a number"),
        ("@reboot", "@reboot is not supported"),
        ("@dayly", "unknown macro '@dayly'; did you mean @daily?"),
        ("@Daily", "unknown macro '@Daily'"),
        ("0 0 15W * *", "day-of-month field: '15W' is Quartz syntax"),
        ("0 0 LW * *", "day-of-month field: 'LW': Quartz's W (the nearest weekday) is not"),
        ("0 0 ? * 1", "day-of-month field: '?': Quartz's '?' is not supported"),
        ("0 0 * * ~", "day-of-week field: '~': cronie's random '~' is not supported"),
        ("0 0 * * monday", "day-of-week field: unknown name 'monday'; did you mean 'mon'?"),
        ("0 0 * mon *", "month field: unknown name 'mon'"),
        ("0 0 jan * *", "day-of-month field: 'jan' is not a number"),
        ("0 1,,2 * * *", "hour field: empty list item"),
        ("0 1, * * *", "hour field: empty list item"),
        ("0 1- * * *", "hour field: a number is missing"),
        ("0 -1 * * *", "hour field: a number is missing"),
        ("0 +1 * * *", "hour field: '+1' is not a number"),
        (
            "0 \u0661 * * *",
            "hour field: character '\u0661' (U+0661) is not allowed",
        ),  # Arabic-Indic 1
        (
            "\uff10 0 * * *",
            "minute field: character '\uff10' (U+FF10) is not allowed",
        ),  # fullwidth 0
        ("0\u00a00 * * *", "cron expression: character '\\xa0' (U+00A0) is not allowed"),
        ("0 0 * * 1\uff0c2", "day-of-week field: character '\uff0c' (U+FF0C) is not allowed"),
        ("0 0 * * * *\x1b", "day-of-week field: character '\\x1b'"),
        ("0\u00a00 * * * *", "minute field: character '\\xa0' (U+00A0) is not allowed"),
        ("0 0 * * *\n", "day-of-week field: character '\\n' (U+000A) is not allowed"),
        ("0 0 * * * \u0000", "day-of-week field: character '\\x00' (U+0000) is not allowed"),
    ],
)
def test_errors(expr: str, message: str) -> None:
    with pytest.raises(TimingError) as info:
        parse_cron(expr)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("value", [None, 5, b"* * * * *", ["*"] * 5])
def test_non_string(value: object) -> None:
    with pytest.raises(TimingError, match="cron expression must be a string"):
        parse_cron(value)  # type: ignore[arg-type]


def test_timing_error_is_value_error() -> None:
    assert issubclass(TimingError, ValueError)


# --- L and # (issue 25) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "days", "last_days", "weekdays", "last_weekdays", "nth"),
    [
        ("0 0 L * *", (), (0,), ALL_DOW, (), ()),
        ("0 0 l * *", (), (0,), ALL_DOW, (), ()),
        ("0 0 L-3 * *", (), (3,), ALL_DOW, (), ()),
        ("0 0 L-0 * *", (), (0,), ALL_DOW, (), ()),
        ("0 0 1,15,L,L-1 * *", (1, 15), (0, 1), ALL_DOW, (), ()),
        ("0 0 * * 5L", ALL_DOM, (), (), (5,), ()),
        ("0 0 * * friL,FRIL,fril,FriL", ALL_DOM, (), (), (5,), ()),
        ("0 0 * * 7L,0l", ALL_DOM, (), (), (0,), ()),  # Sunday is 0 and 7
        ("0 0 * * 1#2", ALL_DOM, (), (), (), ((1, 2),)),
        ("0 0 * * mon#2,MON#4,sun#5,7#1", ALL_DOM, (), (), (), ((0, 1), (0, 5), (1, 2), (1, 4))),
        ("0 0 * * 1-5,5L,6#1", ALL_DOM, (), (1, 2, 3, 4, 5), (5,), ((6, 1),)),
        ("0 0 L * 5L", (), (0,), (), (5,), ()),
    ],
)
def test_last_and_nth(expr, days, last_days, weekdays, last_weekdays, nth) -> None:
    e = parse_cron(expr)
    assert (e.days, e.last_days, e.weekdays, e.last_weekdays, e.nth_weekdays) == (
        days, last_days, weekdays, last_weekdays, nth)


@pytest.mark.parametrize(
    ("expr", "day_or", "fixed_time", "extensions"),
    [
        ("0 0 L * *", False, True, ("L",)),
        ("0 0 L * 5L", True, True, ("L",)),  # both restricted: a day matching either
        ("0 0 */2 * 1#1", False, True, ("#",)),  # '*/2' counts as '*': both must
        ("*/5 * * * 5L,1#1", False, False, ("L", "#")),
        ("0 0 1 * *", False, True, ()),
    ],
)
def test_flags_with_last_and_nth(expr, day_or, fixed_time, extensions) -> None:
    e = parse_cron(expr)
    assert (e.day_or, e.fixed_time, e.extensions) == (day_or, fixed_time, extensions)


@pytest.mark.parametrize(
    ("expr", "never"),
    [
        ("0 0 L-28 2 *", False),  # day 1 of a leap February
        ("0 0 L-29 2 *", True),
        ("0 0 L-29 2,4 *", False),
        ("0 0 L-30 2 *", True),
        ("0 0 L-30 4,6,9,11 *", True),
        ("0 0 L-30 * *", False),  # day 1 of a 31-day month
        ("0 0 L-30 2 1", False),  # either: Mondays of February
        ("0 0 * 2 1#5", False),  # a leap February starting on Monday (2016, 2044)
    ],
)
def test_never_fires_with_last(expr, never) -> None:
    assert parse_cron(expr).never_fires() is never


@pytest.mark.parametrize(
    ("expr", "first", "length", "days"),
    [  # first: weekday of day 1 (0 = Sunday)
        ("0 0 L * *", 0, 28, (28,)),
        ("0 0 L-2,1 * *", 3, 31, (1, 29)),
        ("0 0 * * 5L", 0, 30, (27,)),  # Fridays 6, 13, 20, 27
        ("0 0 * * 5#1,5#5", 0, 30, (6,)),  # Fridays 6, 13, 20, 27: no fifth
        ("0 0 * * 0#5", 0, 29, (29,)),  # the fifth Sunday of a leap February starting Sunday
        ("0 0 L * 1#1", 3, 30, (6, 30)),
    ],
)
def test_month_days(expr, first, length, days) -> None:
    assert parse_cron(expr).month_days(first, length) == days


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("0 0 L-40 * *", "day-of-month field: 'L-40': N in L-N is at most 30"),
        ("0 0 L-x * *", "day-of-month field: 'L-x': N in L-N must be a number"),
        ("0 0 L- * *", "day-of-month field: 'L-': N in L-N must be a number"),
        ("0 0 1-L * *", "day-of-month field: '1-L': L stands alone in day-of-month"),
        ("0 0 L/2 * *", "day-of-month field: 'L/2': L stands alone"),
        ("0 0 3L * *", "day-of-month field: '3L': L stands alone"),
        ("0 0 L-99999 * *", "day-of-month field: value 99999 is too large"),
        ("0 0 1#2 * *", "day-of-month field: '1#2': '#' (the n-th weekday) is for day-of-week"),
        ("0 0 * L *", "month field: 'L': L (the last) is for day-of-month (L, L-3) and day-of-week"),
        ("0 L * * *", "hour field: 'L': L (the last) is for day-of-month"),
        ("L 0 * * *", "minute field: 'L': L (the last)"),
        ("0 0 * 1#2 *", "month field: '1#2': '#' (the n-th weekday) is for day-of-week only"),
        ("0 0 * * 8#1", "day-of-week field: 8 is out of range 0-7"),
        ("0 0 * * 1#6", "day-of-week field: '1#6': K in N#K is the week of the month, 1 to 5"),
        ("0 0 * * 1#0", "day-of-week field: '1#0': K in N#K is the week of the month"),
        ("0 0 * * 1#", "day-of-week field: '1#': K in N#K"),
        ("0 0 * * #2", "day-of-week field: '#2': L and # follow one weekday"),
        ("0 0 * * 1-5#2", "day-of-week field: '1-5#2': L and # follow one weekday"),
        ("0 0 * * */2#1", "day-of-week field: '*/2#1': L and # follow one weekday"),
        ("0 0 * * 1#2#3", "day-of-week field: '1#2#3': K in N#K"),
        ("0 0 * * monday#2", "day-of-week field: unknown name 'monday'"),
        ("0 0 * * L", "day-of-week field: 'L' alone: in day-of-week write NL"),
        ("0 0 * * L5", "day-of-week field: 'L5': in day-of-week, L follows a weekday"),
        ("0 0 * * 1-5L", "day-of-week field: '1-5L': L and # follow one weekday"),
        ("0 0 * * 8L", "day-of-week field: 8 is out of range 0-7"),
        ("0 0 * * 5LW", "day-of-week field: '5LW': in day-of-week, L follows a weekday"),
        ("0 0 LW * *", "day-of-month field: 'LW': Quartz's W"),
        ("0 0 * * 5L\u0661", "day-of-week field: character '\u0661' (U+0661) is not allowed"),
        ("0 0 \uff2c * *", "day-of-month field: character '\uff2c' (U+FF2C) is not allowed"),
    ],
)
def test_last_and_nth_errors(expr: str, message: str) -> None:
    with pytest.raises(TimingError) as info:
        parse_cron(expr)
    assert str(info.value).startswith(message), str(info.value)
