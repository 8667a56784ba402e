"""A cron expression or an ``every`` interval in plain words, for people reading a dashboard:
``30 4 * * 1-5`` -> "at 04:30, Monday to Friday", ``0 9 * * 5L`` -> "at 09:00, on the last
Friday of the month". Pure. The expression has been validated already, and its ``H`` resolved
for the schedule (``ScheduleSpec.resolved_cron``); anything this does not know how to say reads
field by field, never wrongly."""

from __future__ import annotations

MACROS = {
    "@hourly": "every hour, at minute 0",
    "@daily": "every day at 00:00",
    "@midnight": "every day at 00:00",
    "@weekly": "every Sunday at 00:00",
    "@monthly": "at 00:00 on day 1 of every month",
    "@yearly": "at 00:00 on 1 January",
    "@annually": "at 00:00 on 1 January",
}
DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
DAY_NAMES = {d[:3].lower(): i for i, d in enumerate(DAYS[:7])}
MONTHS = ["", "January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
MONTH_NAMES = {m[:3].lower(): i for i, m in enumerate(MONTHS) if m}


def describe_every(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"every {unit}" if n == 1 else f"every {n} {unit}s"
    text = f"{seconds:g}"
    return "every second" if text == "1" else f"every {text} seconds"


def _value(text: str, names: dict[str, int]) -> int | None:
    low = text.lower()
    if low in names:
        return names[low]
    return int(low) if low.isdigit() else None


def _list(field: str, names: dict[str, int], word) -> str | None:
    """A list of single values and ranges, in words; None when it holds a step."""
    parts = []
    for item in field.split(","):
        if "/" in item:
            return None
        lo, _, hi = item.partition("-")
        a, b = _value(lo, names), _value(hi, names) if hi else None
        if a is None or (hi and b is None):
            return None
        parts.append(f"{word(a)} to {word(b)}" if hi else word(a))
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


ORDINALS = ["", "first", "second", "third", "fourth", "fifth"]


def _specials(field: str, word) -> str | None:
    """A list holding ``L`` or ``#`` items (and single values), in words; None otherwise."""
    parts = [word(item) for item in field.split(",")]
    if None in parts or not any("last" in p or "#" in i for p, i in zip(parts, field.split(","),
                                                                        strict=True)):
        return None
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def _last_day(item: str) -> str | None:
    """A day-of-month item: ``L``, ``L-3`` or a day number."""
    low = item.lower()
    if low == "l":
        return "the last day"
    if low.startswith("l-") and low[2:].isdigit():
        n = int(low[2:])
        return f"{n} day{'s' if n != 1 else ''} before the last day"
    return f"day {int(low)}" if low.isdigit() else None


def _weekday_item(item: str) -> str | None:
    """A day-of-week item: ``5L``, ``friL``, ``1#2``, ``mon#2`` or one weekday."""
    low = item.lower()
    day, mark, week = low.partition("#")
    if not mark and low.endswith("l"):
        day = low[:-1]
    n = _value(day, DAY_NAMES)
    if n is None or n > 7:
        return None
    if mark:
        return f"the {ORDINALS[int(week)]} {DAYS[n]}" if week.isdigit() and 1 <= int(week) <= 5 else None
    return f"the last {DAYS[n]}" if low.endswith("l") else DAYS[n]


def _step(field: str, unit: str) -> str | None:
    if field.startswith("*/") and field[2:].isdigit():
        n = int(field[2:])
        return f"every {unit}" if n == 1 else f"every {n} {unit}s"
    return None


def describe_cron(expr: str) -> str:
    text = expr.strip()
    if text.lower() in MACROS:
        return MACROS[text.lower()]
    fields = text.split()
    seconds = fields.pop(0) if len(fields) == 6 else None
    if len(fields) != 5:
        return text
    minute, hour, dom, month, dow = fields
    when = _time_of_day(seconds, minute, hour)
    days = []
    if dom != "*":
        d = _step(dom, "day") or _list(dom, {}, str)
        last = None if d else _specials(dom, _last_day)
        days.append(f"on day {d} of the month" if d and not d.startswith("every")
                    else d or (f"on {last} of the month" if last else dom))  # fmt: skip
    if dow != "*":
        d = _list(dow, DAY_NAMES, lambda i: DAYS[i % 8])
        last = None if d else _specials(dow, _weekday_item)
        days.append(("on " + d) if d else f"on {last} of the month" if last else f"on weekdays {dow}")
    day_text = " or ".join(days) if days else ("every day" if hour.isdigit() else "")
    if month != "*":
        m = _list(month, MONTH_NAMES, lambda i: MONTHS[i] if 0 < i < 13 else str(i))
        day_text += (", " if day_text else "") + f"in {m or month}"
    return f"{when}, {day_text}" if day_text else when


def _time_of_day(seconds: str | None, minute: str, hour: str) -> str:
    sec = "" if seconds in (None, "0") else f" (second {seconds})"
    if minute.isdigit() and hour.isdigit():
        clock = f"{int(hour):02d}:{int(minute):02d}"
        return f"at {clock}" + ("" if seconds in (None, "0") else f":{int(seconds):02d}"
                                 if seconds and seconds.isdigit() else sec)
    if hour == "*":
        if minute == "*":
            if seconds in (None, "0"):
                return "every minute"
            if seconds == "*":
                return "every second"
            return _step(seconds, "second") or f"at second {seconds} of every minute"
        step = _step(minute, "minute")
        if step:
            return step + sec
        return f"at minute {_list(minute, {}, str) or minute} of every hour" + sec
    hours = _step(hour, "hour") or f"hour {_list(hour, {}, str) or hour}"
    if minute.isdigit():
        return f"at minute {int(minute)} of {hours if hours.startswith('every') else hours}" + sec
    return f"minute {minute} of {hours}" + sec


def describe(cron: str | None, every: float | None) -> str:
    if every is not None:
        return describe_every(every)
    return describe_cron(cron or "")
