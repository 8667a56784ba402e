"""A fast reader for the plain subset of TOML that schedule files are written in, with lines.

``tomllib`` is pure Python and reads about 4 MB/s; 10,000 schedules are 3.6 MB, so it alone
would spend half of ``validate``'s 2 s budget (SPEC §3). Nearly every schedule file uses only
one-line constructs, which a regular expression per line reads several times faster, and this
pass records each key's line at the same time.

The subset, line by line (anything else, anywhere in the file, returns None and the caller
reads the file with ``tomllib``, which stays the judge of what TOML means and of every error):

- blank lines and comments;
- headers ``[key]`` with one bare or quoted key (no dots, no ``[[arrays]]``);
- ``key = value`` with one bare or quoted key, where value is a string without escapes, a
  decimal integer or float, ``true``/``false``, a one-line array of those, or a one-line inline
  table of ``key = scalar-or-array`` (no nesting);
- no key or table defined twice (tomllib reports those).

A differential test (tests/test_spec_fasttoml.py) checks that whatever this reads, ``tomllib``
reads the same.
"""

from __future__ import annotations

import re
from typing import Any

_WS = r"[ \t]*"
_BARE = r"[A-Za-z0-9_-]+"
_BASIC = r'"[^"\\\x00-\x08\x0a-\x1f\x7f]*"'
_LITERAL = r"'[^'\x00-\x08\x0a-\x1f\x7f]*'"
_KEY = rf"(?:{_BARE}|{_BASIC}|{_LITERAL})"
_INT = r"[+-]?(?:0|[1-9][0-9]{0,17})"
_FLOAT = r"[+-]?(?:0|[1-9][0-9]{0,17})(?:\.[0-9]+(?:[eE][+-]?[0-9]{1,3})?|[eE][+-]?[0-9]{1,3})"
_SCALAR = rf"(?:{_BASIC}|{_LITERAL}|{_FLOAT}|{_INT}|true|false)"
_ARRAY = rf"\[{_WS}(?:{_SCALAR}{_WS}(?:,{_WS}{_SCALAR}{_WS})*(?:,{_WS})?)?\]"
_PAIR = rf"{_KEY}{_WS}={_WS}(?:{_SCALAR}|{_ARRAY})"
_INLINE = rf"\{{{_WS}(?:{_PAIR}{_WS}(?:,{_WS}{_PAIR}{_WS})*)?\}}"
_COMMENT = r"(?:#[^\x00-\x08\x0a-\x1f\x7f]*)?"

_KEY_VALUE = re.compile(rf"{_WS}({_KEY}){_WS}={_WS}({_SCALAR}|{_ARRAY}|{_INLINE}){_WS}{_COMMENT}")
_HEADER = re.compile(rf"{_WS}\[{_WS}({_KEY}){_WS}\]{_WS}{_COMMENT}")
_BLANK = re.compile(rf"{_WS}{_COMMENT}")
# Tokens of an array or inline table already matched by the patterns above.
_TOKEN = re.compile(rf"({_KEY}){_WS}=|({_BASIC}|{_LITERAL}|{_FLOAT}|{_INT}|true|false)|([\[\]])")


class _Leave(Exception):
    """The text leaves the subset: read it with tomllib."""


def _key(text: str) -> str:
    return text[1:-1] if text[0] in "\"'" else text


def _scalar(text: str) -> Any:
    first = text[0]
    if first in "\"'":
        return text[1:-1]
    if text == "true":
        return True
    if text == "false":
        return False
    if "." in text or "e" in text or "E" in text:
        return float(text)
    return int(text)


def _compound(text: str) -> Any:
    """An array of scalars, or an inline table of scalars and such arrays."""
    table: dict[str, Any] | None = {} if text[0] == "{" else None
    array: list[Any] | None = None
    key: str | None = None
    for m in _TOKEN.finditer(text):
        k, scalar, bracket = m.group(1), m.group(2), m.group(3)
        if k is not None:
            key = _key(k)
            if table is None or key in table:
                raise _Leave
        elif scalar is not None:
            value = _scalar(scalar)
            if array is not None:
                array.append(value)
            elif table is not None:
                table[key] = value  # type: ignore[index]
            else:
                raise _Leave
        elif bracket == "[":
            array = []
        elif array is not None:  # "]"
            if table is None:
                return array
            table[key] = array  # type: ignore[index]
            array = None
    if table is None:
        raise _Leave
    return table


def parse(text: str) -> tuple[dict[str, Any], dict[tuple[str, ...], int]] | None:
    """(document, first line of each key path), or None when ``text`` leaves the subset."""
    doc: dict[str, Any] = {}
    lines: dict[tuple[str, ...], int] = {}
    table = doc
    name: tuple[str, ...] = ()
    key_value = _KEY_VALUE.fullmatch
    header = _HEADER.fullmatch
    blank = _BLANK.fullmatch
    try:
        for lineno, line in enumerate(text.split("\n"), 1):
            if line.endswith("\r"):
                line = line[:-1]
            m = key_value(line)
            if m is not None:
                key = _key(m.group(1))
                if key in table:
                    return None
                raw = m.group(2)
                first = raw[0]
                table[key] = _compound(raw) if first in "[{" else _scalar(raw)
                lines[(*name, key)] = lineno
                continue
            m = header(line)
            if m is not None:
                key = _key(m.group(1))
                if key in doc:
                    return None
                table = doc[key] = {}
                name = (key,)
                lines[name] = lineno
                continue
            if blank(line) is None:
                return None
    except (_Leave, ValueError, OverflowError):
        return None
    return doc, lines
