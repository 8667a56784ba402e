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
        ("0 0 L * *", "day-of-month field: 'L' is Quartz syntax"),
        ("0 0 15W * *", "day-of-month field: '15W' is Quartz syntax"),
        ("0 0 LW * *", "day-of-month field: 'LW' is Quartz syntax"),
        ("0 0 * * 5L", "day-of-week field: '5L' is Quartz syntax"),
        ("0 0 * * 5#3", "day-of-week field: '5#3': Quartz's '#' is not supported"),
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
