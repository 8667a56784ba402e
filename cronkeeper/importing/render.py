"""Converted entries -> schedule-file TOML, checked by the schedule validator before it is written.

Stable: no timestamps, entries in input order, keys in a fixed order, so the same input gives the
same bytes. Strings are TOML basic strings (JSON's escapes are TOML's, plus DEL escaped); a
payload is an inline table. An entry whose TOML the validator refuses is left out with the
validator's message (e.g. a payload over 8 KiB).
"""

from __future__ import annotations

import json
import math
import tomllib
from datetime import datetime
from typing import Any

from cronkeeper.importing.model import Conversion, Entry, Problem
from cronkeeper.schedule.diagnostics import Severity, safe
from cronkeeper.schedule.validate import check_schedule


class NotToml(ValueError):
    """A value TOML cannot hold (None, NaN, a non-string key ...): the message says which."""


def string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def value(v: Any, path: str = "payload") -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise NotToml(f"{path} is {v!r}: not a JSON number")
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x, f"{path}[{i}]") for i, x in enumerate(v)) + "]"
    if isinstance(v, dict):
        for k in v:
            if not isinstance(k, str):
                raise NotToml(f"{path} has the key {k!r}, not a string")
        items = ", ".join(f"{string(k)} = {value(x, f'{path}.{k}')}" for k, x in v.items())
        return "{ " + items + " }" if items else "{}"
    if v is None:
        raise NotToml(f"{path} is None: TOML (and so a schedule file) has no null")
    raise NotToml(f"{path} is a {type(v).__name__}, not JSON (string, number, bool, list, object)")


def comment(text: str) -> str:
    """A TOML comment holding ``text`` whole, at any length. TOML allows tabs in a comment and
    no other control character: those (and a newline, which would end the comment) are
    escaped by :func:`safe` as ``\\xNN``."""
    return "# " + safe(text) if text else "#"


def entry_text(entry: Entry) -> str:
    lines = [comment(n) for n in entry.notes]
    lines.append(f"[{string(entry.name)}]")
    lines.extend(f"{key} = {value(v, key)}" for key, v in entry.keys)
    return "\n".join(lines) + "\n"


def _check(entry: Entry, text: str, now: datetime) -> str | None:
    """The validator's errors for one rendered entry, or None."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # a bug here, reported rather than written
        return f"cannot be written as TOML: {exc}"
    table = doc.get(entry.name)
    if not isinstance(table, dict):
        return "cannot be written as TOML (no table)"
    _, diagnostics = check_schedule(entry.name, table, file="-", line_of=lambda *_: 0, now=now)
    errors = [d.message for d in diagnostics if d.severity is Severity.ERROR]
    return "; ".join(errors) or None


def render(conversion: Conversion, now: datetime) -> tuple[str, Conversion]:
    """(TOML text, the conversion with entries the validator refuses moved to problems)."""
    parts = ["\n".join(comment(h) for h in conversion.header) + "\n"]
    kept: list[Entry] = []
    problems = list(conversion.problems)
    for entry in conversion.entries:
        try:
            text = entry_text(entry)
        except NotToml as exc:
            problems.append(Problem(entry.where, f"not converted: {exc}"))
            continue
        error = _check(entry, text, now)
        if error is not None:
            problems.append(Problem(entry.where, f"converted schedule is invalid: {error}"))
            continue
        kept.append(entry)
        parts.append(text)
    problems.sort(key=_order)
    extra = conversion.extra
    if conversion.extra_for is not None:
        extra = conversion.extra_for(tuple(kept)) if kept else ()
    result = Conversion(
        source=conversion.source, header=conversion.header, entries=tuple(kept),
        problems=tuple(problems), stem=conversion.stem, extra=extra,
    )  # fmt: skip
    return "\n".join(parts), result


def _order(p: Problem) -> tuple[str, int, str]:
    where, _, line = p.where.rpartition(":")
    return (where, int(line), p.message) if line.isdigit() else (p.where, 0, p.message)
