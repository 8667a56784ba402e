"""A cron expression or an ``every`` interval in plain words, for people reading a dashboard:
``30 4 * * 1-5`` -> "at 04:30, Monday to Friday". Pure. The expression has been validated
already; anything this does not know how to say reads field by field, never wrongly."""

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
        days.append(f"on day {d} of the month" if d and not d.startswith("every") else d or dom)
    if dow != "*":
        d = _list(dow, DAY_NAMES, lambda i: DAYS[i % 8])
        days.append(("on " + d) if d else f"on weekdays {dow}")
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
