"""The fields of a cron expression, shared by the parser (:mod:`cron`) and ``H`` (:mod:`hashed`):
their names and ranges, values and names within them, the characters allowed, and the one shape
of their error messages (``hour field: ...``)."""

from __future__ import annotations

import difflib
import re

from cronkeeper.timing.errors import TimingError

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# name, low, high, names (value of names[i] is i + low)
FieldSpec = tuple[str, int, int, tuple[str, ...]]
SECOND: FieldSpec = ("second", 0, 59, ())
FIELDS5: tuple[FieldSpec, ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day-of-week", 0, 7, DAYS),
)
FIELDS6: tuple[FieldSpec, ...] = (SECOND, *FIELDS5)
DOM, DOW = "day-of-month", "day-of-week"
NUMBER = re.compile(r"[0-9]+")
MAX_DIGITS = 4  # no field value or useful step is past 60; 4 digits keep the message exact
MAX_STEP = 60  # the most values any field has (seconds, minutes)
SEPARATORS = re.compile(r"[ \t]+")
_LAST = re.compile(r"(?i)(?:[0-9]*|[a-z]{3})L(?:-[0-9]*)?")
_QUARTZ = re.compile(r"(?i)[0-9]*W|LW|\?")


def fail(field: str, message: str) -> TimingError:
    return TimingError(f"{field} field: {message}")


def number(token: str, field: str, what: str) -> int:
    """``int(token)`` for a string of ASCII digits, its length bounded first."""
    if len(token) > MAX_DIGITS:
        shown = token if len(token) <= 12 else f"{token[:6]}...({len(token)} digits)"
        raise fail(field, f"{what} {shown} is too large: no cron field goes past {MAX_STEP}")
    return int(token)


def value(token: str, spec: FieldSpec) -> int:
    """One value of a field: a number or a name, within the field's range."""
    field, low, high, names = spec
    if NUMBER.fullmatch(token):
        found = number(token, field, "value")
    elif token.lower() in names:
        found = names.index(token.lower()) + low
    elif token == "":
        raise fail(field, "a number is missing")
    elif token[:1] in "Hh":
        raise fail(field, f"{token!r}: H stands for a whole item (H, H(a-b), H/n, H(a-b)/n), "
                          "not a value inside a range")  # fmt: skip
    elif _QUARTZ.fullmatch(token):
        raise fail(field, f"{token!r} is Quartz syntax, which cron does not support")
    elif _LAST.fullmatch(token):
        raise fail(field, f"{token!r}: L (the last) is for day-of-month (L, L-3) and day-of-week "
                          "(5L) only, and stands alone in its list item")
    elif "#" in token:
        raise fail(field, f"{token!r}: '#' (the n-th weekday) is for day-of-week only, as N#K "
                          "(1#2: the second Monday), alone in its list item")
    elif names:
        close = difflib.get_close_matches(token.lower(), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (expected {names[0]}-{names[-1]})"
        raise fail(field, f"unknown name {token!r}{hint}")
    else:
        raise fail(field, f"{token!r} is not a number")
    if not low <= found <= high:
        raise fail(field, f"{found} is out of range {low}-{high}")
    return found


def range_end(spec: FieldSpec, start: int, end: int) -> int:
    """cronie: a day-of-week range may end on Sunday 0 (``fri-sun`` is 5-7)."""
    return 7 if spec[0] == DOW and end == 0 and start > 0 else end


def step(text: str, item: str, spec: FieldSpec) -> int:
    """The step after ``/`` in ``item``: a number from 1 to :data:`MAX_STEP`."""
    field, low, high, _ = spec
    if not NUMBER.fullmatch(text):
        raise fail(field, f"step {text!r} in {item!r} is not a number")
    found = number(text, field, "step")
    if found == 0:
        raise fail(field, f"step in {item!r} is zero")
    if found > MAX_STEP:
        raise fail(field, f"step {found} in {item!r} is larger than any cron field ({low}-{high} here)")
    return found


def field_names(count: int) -> tuple[str, ...]:
    if count == 5:
        return tuple(f[0] for f in FIELDS5)
    if count == 6:
        return tuple(f[0] for f in FIELDS6)
    return ()


def check_characters(expr: str) -> None:
    """Refuse any character outside printable ASCII (tabs allowed), naming its field."""
    if expr.isascii() and expr.isprintable():  # the usual case: nothing to look for
        return
    for position, ch in enumerate(expr):
        if not ch.isascii() or (not ch.isprintable() and ch != "\t"):
            tokens = SEPARATORS.split(expr[:position].lstrip(" \t"))
            count = len(SEPARATORS.split(expr.strip(" \t")))
            names = field_names(count)
            where = f"{names[len(tokens) - 1]} field" if names else "cron expression"
            raise TimingError(
                f"{where}: character {ch!r} (U+{ord(ch):04X}) is not allowed; "
                "use ASCII digits, names and , - / * (and H, L, #)"
            )
