"""The cron grammar, as cronie reads it, into a frozen :class:`CronExpr`.

Accepted: 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds
field; ``*``, numbers, names (``jan``-``dec``, ``sun``-``sat``, any case), ranges ``a-b``, steps
``*/n`` and ``a-b/n``, lists ``a,b``; day-of-week 0 and 7 are Sunday, and a range may end on
Sunday 0 (``fri-sun``, as cronie). Macros: ``@hourly``, ``@daily`` and ``@midnight`` (cronie's
alias), ``@weekly``, ``@monthly``, ``@yearly``, ``@annually``.

Refused, with a message naming the field: ``a/n`` (cronie refuses it too: write ``a-59/n``),
``@reboot``, Quartz's ``L W # ?``, cronie's random ``~``, reversed ranges, zero steps, values out of
range, empty items, and any character outside ASCII (Arabic-Indic or fullwidth digits, no-break
spaces, fullwidth commas). Numbers are bounded before conversion: no field holds more than 60
values, so a number of more than :data:`MAX_DIGITS` digits is refused as such (``int()`` itself
refuses strings past 4,300 digits), and so is a step larger than any field (over 60). A step
that cannot step within its range (``*/61`` is an error already; ``*/60`` in minutes, ``*/24`` in
hours, ``0-10/15``: one value fires) is a warning in :attr:`CronExpr.warnings`.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

from cronkeeper.timing.errors import TimingError

MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# name, low, high, names (value of names[i] is i + low)
FieldSpec = tuple[str, int, int, tuple[str, ...]]
_SECOND: FieldSpec = ("second", 0, 59, ())
_FIELDS5: tuple[FieldSpec, ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day-of-week", 0, 7, DAYS),
)
_NUMBER = re.compile(r"[0-9]+")
MAX_DIGITS = 4  # no field value or useful step is past 60; 4 digits keep the message exact
MAX_STEP = 60  # the most values any field has (seconds, minutes)
_QUARTZ = re.compile(r"(?i)[0-9]*L(-[0-9]+)?|[0-9]*W|LW|.*#.*|\?")
# Longest day of each month in any year (February 29 in leap years).
MAX_DOM = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_SEPARATORS = re.compile(r"[ \t]+")


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: the sorted values of each field, and cronie's ``*`` flags."""

    source: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]  # day-of-month
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday .. 6 = Saturday (7 folded into 0)
    minute_star: bool  # the field starts with '*' (cronie's MIN_STAR)
    hour_star: bool
    dom_star: bool
    dow_star: bool
    has_seconds: bool = False
    # Legal but probably not meant: a step that can never step (``*/60`` in minutes).
    warnings: tuple[str, ...] = ()

    def __hash__(self) -> int:
        """The source text's hash (cached by ``str``): equal expressions share their source, and
        the triggers' shared tables look expressions up on every call."""
        return hash(self.source)

    @property
    def fixed_time(self) -> bool:
        """cronie's rule: fixed-time unless the minute or hour field starts with ``*``."""
        return not (self.minute_star or self.hour_star)

    @property
    def day_or(self) -> bool:
        """Both day fields restricted: a day matching either fires (POSIX); else both must."""
        return not (self.dom_star or self.dow_star)

    def never_fires(self) -> bool:
        """True if no date of any year matches (``0 0 30 2 *``, ``0 0 31 4,6 *``)."""
        if self.day_or:  # the day-of-week part alone matches some day of every month
            return False
        return not any(d <= MAX_DOM[m] for m in self.months for d in self.days)


def _fail(field: str, message: str) -> TimingError:
    return TimingError(f"{field} field: {message}")


def _number(token: str, field: str, what: str) -> int:
    """``int(token)`` for a string of ASCII digits, its length bounded first."""
    if len(token) > MAX_DIGITS:
        shown = token if len(token) <= 12 else f"{token[:6]}...({len(token)} digits)"
        raise _fail(field, f"{what} {shown} is too large: no cron field goes past {MAX_STEP}")
    return int(token)


def _value(token: str, field: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if _NUMBER.fullmatch(token):
        value = _number(token, field, "value")
    elif token.lower() in names:
        value = names.index(token.lower()) + low
    elif token == "":
        raise _fail(field, "a number is missing")
    elif _QUARTZ.fullmatch(token):
        raise _fail(field, f"{token!r} is Quartz syntax, which cron does not support")
    elif names:
        close = difflib.get_close_matches(token.lower(), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (expected {names[0]}-{names[-1]})"
        raise _fail(field, f"unknown name {token!r}{hint}")
    else:
        raise _fail(field, f"{token!r} is not a number")
    if not low <= value <= high:
        raise _fail(field, f"{value} is out of range {low}-{high}")
    return value


def _parse_item(
    item: str, spec: tuple[str, int, int, tuple[str, ...]], warnings: list[str]
) -> range:
    field, low, high, names = spec
    if item == "":
        raise _fail(field, "empty list item")
    for bad in "~#?":
        if bad in item:
            what = "cronie's random '~'" if bad == "~" else f"Quartz's {bad!r}"
            raise _fail(field, f"{item!r}: {what} is not supported")
    body, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _NUMBER.fullmatch(step_text):
            raise _fail(field, f"step {step_text!r} in {item!r} is not a number")
        step = _number(step_text, field, "step")
        if step == 0:
            raise _fail(field, f"step in {item!r} is zero")
        if step > MAX_STEP:
            raise _fail(
                field, f"step {step} in {item!r} is larger than any cron field ({low}-{high} here)"
            )
    if body == "*":
        return _stepped(item, range(low, high + 1, step), field, warnings)
    first, dash, last = body.partition("-")
    start = _value(first, field, low, high, names)
    if not dash:
        if slash:
            raise _fail(
                field,
                f"{item!r}: a step needs a range or '*' (cron refuses 'a/n'; "
                f"write {first}-{high}/{step_text})",
            )
        return range(start, start + 1)
    end = _value(last, field, low, high, names)
    if field == "day-of-week" and end == 0 and start > 0:
        end = 7  # cronie: 'fri-sun' is 5-7
    if start > end:
        raise _fail(field, f"range {item!r} is reversed ({start} > {end})")
    if not slash:
        return range(start, end + 1)
    return _stepped(item, range(start, end + 1, step), field, warnings)


def _stepped(item: str, values: range, field: str, warnings: list[str]) -> range:
    """A stepped range; a step that never steps (one value) is legal but probably a mistake."""
    if len(values) == 1 and values.stop - values.start > 1:
        warnings.append(
            f"{field} field: step {values.step} in {item!r} is past its range "
            f"({values.start}-{values.stop - 1}): only {values.start} fires; "
            f"write {values.start} if that is meant"
        )
    return values


def _parse_field(
    text: str, spec: tuple[str, int, int, tuple[str, ...]], warnings: list[str]
) -> tuple[int, ...]:
    values: set[int] = set()
    for item in text.split(","):
        values.update(_parse_item(item, spec, warnings))
    if spec[0] == "day-of-week" and 7 in values:
        values.discard(7)
        values.add(0)
    return tuple(sorted(values))


def _field(
    text: str, spec: tuple[str, int, int, tuple[str, ...]], warnings: list[str]
) -> tuple[int, ...]:
    """``_parse_field``, once per distinct field: tens of thousands of distinct expressions are
    made of a few hundred distinct fields (``*``, ``30``, ``1-5``)."""
    values, found = _field_cached(text, spec)
    warnings.extend(found)
    return values


@functools.lru_cache(maxsize=8192)
def _field_cached(
    text: str, spec: tuple[str, int, int, tuple[str, ...]]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    warnings: list[str] = []
    return _parse_field(text, spec, warnings), tuple(warnings)


def _check_characters(expr: str) -> None:
    if expr.isascii() and expr.isprintable():  # the usual case: nothing to look for
        return
    for position, ch in enumerate(expr):
        if not ch.isascii() or (not ch.isprintable() and ch != "\t"):
            tokens = _SEPARATORS.split(expr[:position].lstrip(" \t"))
            count = len(_SEPARATORS.split(expr.strip(" \t")))
            names = _field_names(count)
            where = f"{names[len(tokens) - 1]} field" if names else "cron expression"
            raise TimingError(
                f"{where}: character {ch!r} (U+{ord(ch):04X}) is not allowed; "
                "use ASCII digits, names and , - / *"
            )


def _field_names(count: int) -> tuple[str, ...]:
    if count == 5:
        return tuple(f[0] for f in _FIELDS5)
    if count == 6:
        return (_SECOND[0],) + tuple(f[0] for f in _FIELDS5)
    return ()


def parse_cron(expr: str) -> CronExpr:
    """Parse ``expr``; TimingError with a message that names the field at fault."""
    if not isinstance(expr, str):
        raise TimingError(f"cron expression must be a string, not {type(expr).__name__}")
    return _parse(expr)


@functools.lru_cache(maxsize=32768)  # one CronExpr per distinct expression (triggers share it)
def _parse(expr: str) -> CronExpr:
    _check_characters(expr)
    text = expr.strip(" \t")
    if text == "":
        raise TimingError("cron expression is empty")
    if text.startswith("@"):
        if text == "@reboot":
            raise TimingError("@reboot is not supported: a schedule fires at times, not at boot")
        if text not in MACROS:
            close = difflib.get_close_matches(text.lower(), list(MACROS), n=1)
            hint = f"; did you mean {close[0]}?" if close else f" (expected {', '.join(MACROS)})"
            raise TimingError(f"unknown macro {text!r}{hint}")
        text = MACROS[text]
    fields = _SEPARATORS.split(text)
    warnings: list[str] = []
    specs: tuple[FieldSpec, ...]
    if len(fields) == 6:
        specs = (_SECOND, *_FIELDS5)
        seconds = _field(fields[0], _SECOND, warnings)
        fields = fields[1:]
    elif len(fields) == 5:
        specs = _FIELDS5
        seconds = (0,)
    else:
        raise TimingError(
            f"cron expression has {len(fields)} field{'s' if len(fields) != 1 else ''}; expected 5 "
            "(minute hour day-of-month month day-of-week) or 6 (a leading seconds field, then those)"
        )
    minute, hour, dom, month, dow = (
        _field(f, spec, warnings) for f, spec in zip(fields, specs[-5:], strict=True)
    )
    return CronExpr(
        source=expr,
        seconds=seconds,
        minutes=minute,
        hours=hour,
        days=dom,
        months=month,
        weekdays=dow,
        minute_star=fields[0].startswith("*"),
        hour_star=fields[1].startswith("*"),
        dom_star=fields[2].startswith("*"),
        dow_star=fields[4].startswith("*"),
        has_seconds=len(specs) == 6,
        warnings=tuple(warnings),
    )
