"""The cron grammar, as cronie reads it, with cronkeeper's ``H``, ``L`` and ``#``, into a frozen
:class:`CronExpr`.

Accepted: 5 fields (minute hour day-of-month month day-of-week) or 6 with a leading seconds
field; ``*``, numbers, names (``jan``-``dec``, ``sun``-``sat``, any case), ranges ``a-b``, steps
``*/n`` and ``a-b/n``, lists ``a,b``; day-of-week 0 and 7 are Sunday, and a range may end on
Sunday 0 (``fri-sun``, as cronie). Macros: ``@hourly``, ``@daily`` and ``@midnight`` (cronie's
alias), ``@weekly``, ``@monthly``, ``@yearly``, ``@annually``.

Extensions (docs/schedules.md), each a whole list item, letters in any case:

- ``H``, ``H(a-b)``, ``H/n``, ``H(a-b)/n`` in any field: a value fixed by a hash of the schedule's
  name. :mod:`cronkeeper.timing.hashed` rewrites them into plain values first, so the expression
  parsed here (``CronExpr.source``) is the resolved one; without a name, ``H`` is an error;
- day-of-month ``L`` (the month's last day) and ``L-N`` (N days before it, N at most 30);
- day-of-week ``NL`` (``5L``, ``friL``: the month's last Friday) and ``N#K`` (``1#2``,
  ``mon#2``: its second Monday; K from 1 to 5).

Refused, with a message naming the field: ``a/n`` (cronie refuses it too: write ``a-59/n``),
``@reboot``, Quartz's ``W`` and ``?``, ``L`` and ``#`` outside their fields, cronie's random ``~``,
reversed ranges, zero steps, values out of range, empty items, and any character outside ASCII
(Arabic-Indic or fullwidth digits, no-break spaces, fullwidth commas). Numbers are bounded before
conversion: no field holds more than 60 values, so a number of more than
:data:`~cronkeeper.timing.fields.MAX_DIGITS` digits is refused as such (``int()`` itself refuses
strings past 4,300 digits), and so is a step larger than any field (over 60). A step that cannot
step within its range (``*/61`` is an error already; ``*/60`` in minutes, ``*/24`` in hours,
``0-10/15``: one value fires) is a warning in :attr:`CronExpr.warnings`.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

from cronkeeper.timing import fields as f
from cronkeeper.timing import hashed
from cronkeeper.timing.errors import TimingError
from cronkeeper.timing.fields import DOM, DOW, FieldSpec

MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
# Longest day of each month in any year (February 29 in leap years).
MAX_DOM = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
MAX_LAST_OFFSET = 30  # L-30 is day 1 of a 31-day month
MAX_WEEK = 5  # N#5: the fifth, in months that have one
_LAST_DAY = re.compile(r"[Ll](?:-(?P<offset>.*))?")
# A day field's items beyond plain values: (N,) for day-of-month L-N (L is L-0); (weekday,) for
# day-of-week NL and (weekday, week) for N#K.
Special = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A parsed cron expression: the sorted values of each field, the day fields' ``L`` and
    ``#`` items, and cronie's ``*`` flags."""

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
    last_days: tuple[int, ...] = ()  # day-of-month L-N: each N (L is 0)
    last_weekdays: tuple[int, ...] = ()  # day-of-week NL: each weekday N (0 = Sunday)
    nth_weekdays: tuple[tuple[int, int], ...] = ()  # day-of-week N#K: (weekday N, week K)

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
        """True if no date of any year matches (``0 0 30 2 *``, ``0 0 31 4,6 *``, ``0 0 L-29 2
        *``). The day-of-week part matches some day of every month shape that recurs: a weekday,
        the last of one, and the fifth of one (a 29-day February starting on it, every 28 years)."""
        if self.day_or:
            return False
        return not any(
            any(d <= MAX_DOM[m] for d in self.days) or any(n < MAX_DOM[m] for n in self.last_days)
            for m in self.months
        )

    def month_days(self, first_weekday: int, length: int) -> tuple[int, ...]:
        """The days of a month of this shape that fire: ``first_weekday`` is day 1's weekday
        (0 = Sunday), ``length`` its number of days. A pure function of the shape (there are
        14), which the triggers share per expression."""
        doms = {d for d in self.days if d <= length}
        doms.update(length - n for n in self.last_days if n < length)
        dows, last, nth = set(self.weekdays), set(self.last_weekdays), set(self.nth_weekdays)

        def dow_match(day: int) -> bool:
            weekday = (first_weekday + day - 1) % 7
            return (weekday in dows or (weekday in last and day + 7 > length)
                    or (weekday, (day + 6) // 7) in nth)  # fmt: skip

        if self.day_or:
            return tuple(d for d in range(1, length + 1) if d in doms or dow_match(d))
        return tuple(d for d in range(1, length + 1) if d in doms and dow_match(d))

    @property
    def extensions(self) -> tuple[str, ...]:
        """Which of cronkeeper's ``L`` and ``#`` the expression uses (``H`` is resolved before
        parsing; :func:`hashed.uses_hash` tells it): what a plain crontab line may not hold."""
        used = []
        if self.last_days or self.last_weekdays:
            used.append("L")
        if self.nth_weekdays:
            used.append("#")
        return tuple(used)


def _last_day(item: str) -> Special:
    """Day-of-month ``L`` or ``L-N``: (N,)."""
    match = _LAST_DAY.fullmatch(item)
    if match is None:
        if "w" in item.lower():
            raise f.fail(DOM, f"{item!r}: Quartz's W (the nearest weekday) is not supported")
        raise f.fail(DOM, f"{item!r}: L stands alone in day-of-month: L (the last day) or L-N "
                          "(N days before it), in a list with other days if need be (1,L)")  # fmt: skip
    text = match.group("offset")
    if text is None:
        return (0,)
    if not f.NUMBER.fullmatch(text):
        raise f.fail(DOM, f"{item!r}: N in L-N must be a number of days (L-3)")
    offset = f.number(text, DOM, "value")
    if offset > MAX_LAST_OFFSET:
        raise f.fail(DOM, f"{item!r}: N in L-N is at most {MAX_LAST_OFFSET} (L-{MAX_LAST_OFFSET}: "
                          "day 1 of a 31-day month)")  # fmt: skip
    return (offset,)


def _weekday(text: str, item: str, spec: FieldSpec) -> int:
    if text == "" or any(c in text for c in "*-/,"):
        raise f.fail(DOW, f"{item!r}: L and # follow one weekday, a number 0-7 or a name "
                          "(5L, friL, 1#2, mon#2)")  # fmt: skip
    return f.value(text, spec) % 7


def _weekday_special(item: str, spec: FieldSpec) -> Special:
    """Day-of-week ``NL``: (weekday,); ``N#K``: (weekday, K)."""
    day, hash_mark, week = item.partition("#")
    if hash_mark:
        if not f.NUMBER.fullmatch(week) or not 1 <= f.number(week, DOW, "value") <= MAX_WEEK:
            raise f.fail(DOW, f"{item!r}: K in N#K is the week of the month, 1 to {MAX_WEEK}")
        return (_weekday(day, item, spec), int(week))
    if item[-1:] not in ("L", "l"):
        raise f.fail(DOW, f"{item!r}: in day-of-week, L follows a weekday: 5L or friL (the "
                          "month's last Friday)")  # fmt: skip
    if len(item) == 1:
        raise f.fail(DOW, "'L' alone: in day-of-week write NL (5L: the last Friday); the last "
                          "day of the month is L in day-of-month")  # fmt: skip
    return (_weekday(item[:-1], item, spec),)


def _parse_item(item: str, spec: FieldSpec, warnings: list[str]) -> range | Special:
    field, low, high, _ = spec
    if item == "":
        raise f.fail(field, "empty list item")
    for bad in "~?":
        if bad in item:
            what = "cronie's random '~'" if bad == "~" else "Quartz's '?'"
            raise f.fail(field, f"{item!r}: {what} is not supported")
    if field == DOM and ("L" in item or "l" in item):
        return _last_day(item)
    if field == DOW and ("#" in item or "L" in item or "l" in item):
        return _weekday_special(item, spec)
    body, slash, step_text = item.partition("/")
    step = f.step(step_text, item, spec) if slash else 1
    if body == "*":
        return _stepped(item, range(low, high + 1, step), field, warnings)
    first, dash, last = body.partition("-")
    start = f.value(first, spec)
    if not dash:
        if slash:
            raise f.fail(
                field,
                f"{item!r}: a step needs a range or '*' (cron refuses 'a/n'; "
                f"write {first}-{high}/{step_text})",
            )
        return range(start, start + 1)
    end = f.range_end(spec, start, f.value(last, spec))
    if start > end:
        raise f.fail(field, f"range {item!r} is reversed ({start} > {end})")
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


# A field's plain values, its L/# items, and its warnings.
_Parsed = tuple[tuple[int, ...], tuple[Special, ...], tuple[str, ...]]


@functools.lru_cache(maxsize=8192)
def _field(text: str, index: int) -> _Parsed:
    """Field ``index`` of :data:`~cronkeeper.timing.fields.FIELDS6`, once per distinct text:
    tens of thousands of distinct expressions are made of a few hundred distinct fields (``*``,
    ``30``, ``1-5``)."""
    spec = f.FIELDS6[index]
    warnings: list[str] = []
    values: set[int] = set()
    specials: set[Special] = set()
    for item in text.split(","):
        found = _parse_item(item, spec, warnings)
        if isinstance(found, range):
            values.update(found)
        else:
            specials.add(found)
    if spec[0] == DOW and 7 in values:
        values.discard(7)
        values.add(0)
    return tuple(sorted(values)), tuple(sorted(specials)), tuple(warnings)


def parse_cron(expr: str, name: str | None = None) -> CronExpr:
    """Parse ``expr`` for the schedule ``name`` (needed by ``H`` only); TimingError with a
    message that names the field at fault."""
    if not isinstance(expr, str):
        raise TimingError(f"cron expression must be a string, not {type(expr).__name__}")
    if ("H" in expr or "h" in expr) and hashed.uses_hash(expr):
        expr = hashed.resolve(expr, name)
    return _parse(expr)


@functools.lru_cache(maxsize=32768)  # one CronExpr per distinct expression (triggers share it)
def _parse(expr: str) -> CronExpr:
    f.check_characters(expr)
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
    words = f.SEPARATORS.split(text)
    if len(words) not in (5, 6):
        raise TimingError(
            f"cron expression has {len(words)} field{'s' if len(words) != 1 else ''}; expected 5 "
            "(minute hour day-of-month month day-of-week) or 6 (a leading seconds field, then those)"
        )
    if hashed.uses_hash(text):  # reached without a name (or a bad H): resolve says which
        hashed.resolve(text, None)
    has_seconds = len(words) == 6
    if not has_seconds:
        words.insert(0, "0")
    (seconds, _, w0), (minute, _, w1), (hour, _, w2), (dom, dom_l, w3), (month, _, w4), (
        dow, dow_specials, w5) = [_field(word, i) for i, word in enumerate(words)]  # fmt: skip
    return CronExpr(
        source=expr,
        seconds=seconds,
        minutes=minute,
        hours=hour,
        days=dom,
        months=month,
        weekdays=dow,
        minute_star=words[1].startswith("*"),
        hour_star=words[2].startswith("*"),
        dom_star=words[3].startswith("*"),
        dow_star=words[5].startswith("*"),
        has_seconds=has_seconds,
        warnings=w0 + w1 + w2 + w3 + w4 + w5 if w0 or w1 or w2 or w3 or w4 or w5 else (),
        last_days=tuple(s[0] for s in dom_l) if dom_l else (),
        last_weekdays=tuple(s[0] for s in dow_specials if len(s) == 1) if dow_specials else (),
        nth_weekdays=(tuple((s[0], s[1]) for s in dow_specials if len(s) == 2)
                      if dow_specials else ()),  # fmt: skip
    )
