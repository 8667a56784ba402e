"""Checks of single values: types, durations, payloads, names. Each returns a message or None.

Durations are cached by their text and payloads by theirs: a directory of 10,000 schedules
repeats a few dozen durations and a few hundred payloads.
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
import re
from typing import Any

from cronkeeper.schedule.model import MAX_PAYLOAD_BYTES, NAME_PATTERN, canonical_json
from cronkeeper.timing import TimingError, parse_duration

NAME_RE = re.compile(NAME_PATTERN)
# `package.module:function` (an import path), or a short name registered with a decorator.
TASK_RE = re.compile(
    r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
    r"|[A-Za-z0-9_][A-Za-z0-9_.-]*",
    re.ASCII,
)
MAX_TASK_LENGTH = 200
# Upper bound of every duration: keeps datetime arithmetic elsewhere far from overflow.
MAX_DURATION = 3660 * 86400.0
# Tables and arrays within each other, at most: a header of dotted keys (``[a.b.c...]``) nests
# tables as deep as it is long, which tomllib reads, but a value hundreds of levels deep cannot
# be rendered, compared or written as JSON within Python's recursion limit.
MAX_DEPTH = 64


# A string's NUL ("\u0000" in TOML or JSON): no text or jsonb value of PostgreSQL holds one, so
# the leader could never record the version (SPEC §10: refused here, with where it is).
NUL_PROBLEM = "contains a NUL character (\\u0000), which PostgreSQL cannot store"


def type_name(value: Any) -> str:
    """The TOML name of a value's type, for messages."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, _dt.datetime):
        return "a datetime"
    if isinstance(value, _dt.date):
        return "a date"
    if isinstance(value, _dt.time):
        return "a time"
    return type(value).__name__  # pragma: no cover - tomllib makes nothing else


def shown(value: Any, limit: int = 60) -> str:
    """A short rendering of a user value for a message (escaped later, at render time)."""
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.lru_cache(maxsize=4096)
def _parse_duration(text: str) -> float | str:
    try:
        seconds = float(parse_duration(text))
    except TimingError as exc:
        return str(exc)
    except (ValueError, OverflowError) as exc:  # defensive: the contract says TimingError
        return f"invalid duration {shown(text)}: {exc}"
    if math.isnan(seconds) or math.isinf(seconds):
        return f"invalid duration {shown(text)}"
    return seconds


def duration(key: str, value: Any, *, minimum: float = 0.0, strict: bool = False) -> float | str:
    """Seconds, or an error message. ``strict``: the minimum itself is not allowed."""
    if not isinstance(value, str):
        hint = f' (durations are strings, e.g. "{value}s")' if _is_number(value) else ""
        return f"'{key}' must be a duration string like \"90s\", \"15m\" or \"1h30m\", not {type_name(value)}{hint}"
    seconds = _parse_duration(value)
    if isinstance(seconds, str):
        return f"'{key}': {seconds}"
    if seconds < minimum or (strict and seconds == minimum):
        bound = "greater than" if strict else "at least"
        return f"'{key}' must be {bound} {_fmt_seconds(minimum)}, got {shown(value)}"
    if seconds > MAX_DURATION:
        return f"'{key}' is too long: at most 3660d, got {shown(value)}"
    return seconds


_SIZE = re.compile(r"\s*(\d{1,10})\s*([A-Za-z]*)\s*")
_SIZE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 * 1024}
_SIZE_LOOKALIKES = {"b": "B", "k": "KiB", "kb": "KiB", "kib": "KiB", "m": "MiB", "mb": "MiB",
                    "mib": "MiB"}


def size(key: str, value: Any, *, high: int) -> int | str:
    """Bytes from a size string (``"64KiB"``, ``"1MiB"``, ``"512B"``, ``"0B"``), or an error
    message. Units are binary: 1 KiB = 1024 bytes."""
    example = 'a size string like "64KiB", "1MiB" or "500B"'
    if not isinstance(value, str):
        hint = f' (write "{value}B")' if _is_number(value) and not isinstance(value, float) else ""
        return f"'{key}' must be {example}, not {type_name(value)}{hint}"
    match = _SIZE.fullmatch(value)
    if match is None:
        return f"'{key}': {shown(value)} is not {example}"
    number, unit = int(match[1]), match[2]
    if not unit:
        return f"'{key}': {shown(value)} needs a unit: \"{number}B\" (or KiB, MiB)"
    if unit not in _SIZE_UNITS:
        close = _SIZE_LOOKALIKES.get(unit.lower())
        hint = f'; did you mean "{number}{close}"? (units are B, KiB and MiB)' if close else (
            " (units are B, KiB and MiB)")
        return f"'{key}': unknown unit in {shown(value)}{hint}"
    result = number * _SIZE_UNITS[unit]
    if result > high:
        return f"'{key}' must be at most {_fmt_size(high)}, got {shown(value)}"
    return result


def _fmt_size(count: int) -> str:
    for unit in ("MiB", "KiB"):
        if count % _SIZE_UNITS[unit] == 0 and count:
            return f"{count // _SIZE_UNITS[unit]}{unit}"
    return f"{count}B"


def _fmt_seconds(seconds: float) -> str:
    return f"{seconds:g}s"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def integer(key: str, value: Any, *, low: int, high: int) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int):
        hint = ""
        if isinstance(value, str) and value.strip().isdigit():
            hint = f" (write {value.strip()} without quotes)"
        return f"'{key}' must be an integer, not {type_name(value)}{hint}"
    if not low <= value <= high:
        return f"'{key}' must be between {low} and {high}, got {value}"
    return value


def number(key: str, value: Any, *, low: float, high: float) -> float | str:
    if not _is_number(value):
        return f"'{key}' must be a number, not {type_name(value)}"
    if not (math.isfinite(value) and low <= value <= high):
        return f"'{key}' must be between {low:g} and {high:g}, got {value}"
    return float(value)


def string(key: str, value: Any, *, empty_ok: bool = False) -> str | None:
    """An error message when ``value`` is not a (non-empty) string PostgreSQL can store."""
    if not isinstance(value, str):
        return f"'{key}' must be a string, not {type_name(value)}"
    if "\x00" in value:
        return f"'{key}' {NUL_PROBLEM}"
    if not empty_ok and not value.strip():
        return f"'{key}' must not be empty"
    return None


def name_problem(name: str) -> str | None:
    if NAME_RE.fullmatch(name):
        return None
    message = (
        "invalid schedule name: names are 1-128 characters of lowercase letters, digits, "
        "'.', '_' and '-', starting with a letter or digit"
    )
    suggestion = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")[:128]
    if suggestion and NAME_RE.fullmatch(suggestion):
        message += f"; did you mean '{suggestion}'?"
    return message


def task_problem(value: Any) -> str | None:
    problem = string("task", value)
    if problem is not None:
        return problem
    if len(value) > MAX_TASK_LENGTH or not TASK_RE.fullmatch(value):
        return (
            f"'task' {shown(value)} is not a task name: write an import path like "
            "\"package.module:function\" or a registered name like \"billing.send_invoices\""
        )
    return None


def command_problem(value: Any) -> str | None:
    example = 'e.g. ["/usr/local/bin/backup", "--full"]'
    if isinstance(value, str):
        return f"'command' must be an array of strings (argv, run without a shell), {example}"
    if not isinstance(value, list):
        return f"'command' must be an array of strings, not {type_name(value)}; {example}"
    if not value:
        return f"'command' must not be empty; {example}"
    for i, arg in enumerate(value):
        if not isinstance(arg, str):
            return f"'command' element {i} must be a string, not {type_name(arg)}"
        if "\x00" in arg:
            return f"'command' element {i} contains a NUL character"
    if not value[0].strip():
        return "'command' element 0 (the program) must not be empty"
    return None


def exit_codes(value: Any) -> tuple[int, ...] | str:
    if not isinstance(value, list):
        return f"'permanent_exit_codes' must be an array of integers, not {type_name(value)}"
    codes = set()
    for code in value:
        if isinstance(code, bool) or not isinstance(code, int):
            return f"'permanent_exit_codes' must hold integers, not {type_name(code)}"
        if not 1 <= code <= 255:
            return f"'permanent_exit_codes': {code} is not an exit code between 1 and 255"
        codes.add(code)
    return tuple(sorted(codes))


_PAYLOADS: dict[str, str | tuple[str, tuple[str, ...]]] = {}


def payload_json(value: Any) -> str | tuple[str, tuple[str, ...]]:
    """Canonical JSON of a payload, or ``(message, key path)`` of the first problem.

    Worked out once per distinct payload: generated schedules repeat a few hundred. They are
    told apart by ``repr``, which tells 1 from true from 1.0 (JSON does too)."""
    if not isinstance(value, dict):
        return f"'payload' must be a table (a JSON object), not {type_name(value)}", ()
    try:
        key = repr(value)
    except RecursionError:  # too deep to render: _payload_json says how deep
        return _payload_json(value)
    found = _PAYLOADS.get(key)
    if found is None:
        found = _payload_json(value)
        if len(_PAYLOADS) >= 8192:
            _PAYLOADS.clear()
        _PAYLOADS[key] = found
    return found


def depth(value: Any) -> int:
    """How many tables and arrays ``value`` nests, itself included (a scalar: 0), without
    recursion: a value too deep for Python's stack is measured too."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        item, level = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(
            item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        todo.extend((child, level + 1) for child in children
                    if isinstance(child, dict | list))
    return deepest


def depth_problem(key: str, value: Any) -> str | None:
    """A message if ``value`` nests more than ``MAX_DEPTH`` tables and arrays."""
    levels = depth(value)
    if levels <= MAX_DEPTH:
        return None
    return (f"'{key}' nests tables or arrays {levels} levels deep, more than the {MAX_DEPTH} "
            "allowed")


def _payload_json(value: dict[str, Any]) -> str | tuple[str, tuple[str, ...]]:
    too_deep = depth_problem("payload", value)
    if too_deep is not None:  # before anything that recurses (JSON, the problem walk below)
        return too_deep, ()
    try:
        text = canonical_json(value)  # the fast path: it refuses NaN, infinities and datetimes
    except (TypeError, ValueError, RecursionError):
        try:
            problem = _json_problem(value, ())
        except RecursionError:
            return "'payload' is nested too deeply", ()
        return problem or ("'payload' cannot be written as JSON", ())
    if "\\u0000" in text:  # (or a backslash before "u0000": the walk tells them apart)
        found = _nul_problem(value, ())
        if found is not None:
            return found
    size = len(text.encode("utf-8"))
    if size > MAX_PAYLOAD_BYTES:
        return (
            f"'payload' is {size} bytes as JSON, more than the {MAX_PAYLOAD_BYTES} allowed "
            "(put ids in the payload, not snapshots)",
            (),
        )
    return text


def _nul_problem(value: Any, path: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
    """The first key or string of a payload holding NUL, as ``_json_problem`` says one."""
    if isinstance(value, dict | list):
        items = ((str(k), item) for k, item in value.items()) if isinstance(value, dict) else (
            (f"[{i}]", item) for i, item in enumerate(value))
        for k, item in items:
            where = _where((*path, k))
            if isinstance(value, dict) and "\x00" in k:
                return f"'{_where(path)}' key {shown(k)} {NUL_PROBLEM}", _keys((*path, k))
            if isinstance(item, str) and "\x00" in item:
                return f"'{where}' {NUL_PROBLEM}", _keys((*path, k))
            found = _nul_problem(item, (*path, k))
            if found is not None:
                return found
    return None


def _where(path: tuple[str, ...]) -> str:
    return "payload" + "".join(p if p.startswith("[") else f".{p}" for p in path)


def _keys(path: tuple[str, ...]) -> tuple[str, ...]:
    """The key path to point at: lines are known for keys, not for array elements."""
    first_index = next((i for i, p in enumerate(path) if p.startswith("[")), len(path))
    return path[:first_index]


def _json_problem(value: Any, path: tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
    if isinstance(value, dict):
        for k, v in value.items():
            problem = _json_problem(v, (*path, k))
            if problem is not None:
                return problem
        return None
    if isinstance(value, list):
        for i, v in enumerate(value):
            problem = _json_problem(v, (*path, f"[{i}]"))
            if problem is not None:
                return problem
        return None
    if isinstance(value, str | bool | int):
        return None
    where = _where(path)
    keys = _keys(path)
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return f"'{where}' is {value}, which strict JSON cannot hold", keys
    return (
        f"'{where}' is {type_name(value)}, which JSON cannot hold; write it as a string "
        '(e.g. "2026-01-31T00:00:00Z")',
        keys,
    )
