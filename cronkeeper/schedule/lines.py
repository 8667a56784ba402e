"""Where things are in a TOML file: a light line scanner, because ``tomllib`` gives no positions.

It records the first line of every table header (``[name]``, ``["quoted.name"]``,
``[name.backoff]``, ``[[array]]``) and of every key assignment (``key = ...``, ``a.b = ...``)
under its full key path. Multi-line strings and multi-line arrays are skipped, so their contents
are not mistaken for headers or keys. Keys inside an inline table or an array are not recorded:
:meth:`LineIndex.line` falls back to the longest recorded prefix of a path, which is the line
that holds them (an inline table sits on one line by TOML's rules).

The scanner only points at lines; it never decides whether the file is valid (``tomllib`` does)
and never raises on any input.
"""

from __future__ import annotations

import re

_KEY_PART = r"""[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*"|'[^'\n]*'"""
_KEY_PART_RE = re.compile(_KEY_PART)
# A dotted key followed by "=" (a key assignment) at the start of a stripped line.
_ASSIGN_RE = re.compile(rf"((?:{_KEY_PART})(?:[ \t]*\.[ \t]*(?:{_KEY_PART}))*)[ \t]*=")
# A table header: "[" or "[[", a dotted key, "]" or "]]".
_HEADER_RE = re.compile(rf"(\[\[?)[ \t]*((?:{_KEY_PART})(?:[ \t]*\.[ \t]*(?:{_KEY_PART}))*)[ \t]*\]")
# What matters in a value: strings (skipped whole), brackets (multi-line arrays), comments.
_VALUE_TOKEN_RE = re.compile(r'''"""|\'\'\'|"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|[\[\]{}]|#''')


def _unquote(part: str) -> str:
    if part[0] == "'":
        return part[1:-1]
    if part[0] == '"':
        inner = part[1:-1]
        if "\\" not in inner:
            return inner
        import tomllib

        try:
            return str(tomllib.loads(f"k = {part}")["k"])
        except (tomllib.TOMLDecodeError, RecursionError):
            return inner
    return part


def _split_key(dotted: str) -> tuple[str, ...]:
    return tuple(_unquote(m.group(0)) for m in _KEY_PART_RE.finditer(dotted))


class LineIndex:
    """First line (1-based) of each table header and key path of one TOML file."""

    __slots__ = ("_lines",)

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple[str, ...], int] = {}
        self._scan(text)

    def _record(self, path: tuple[str, ...], lineno: int) -> None:
        lines = self._lines
        for i in range(1, len(path) + 1):
            lines.setdefault(path[:i], lineno)

    def _scan(self, text: str) -> None:
        lines = self._lines
        keys: dict[str, tuple[str, ...]] = {}  # dotted key text -> parts ("cron" repeats a lot)
        assign = _ASSIGN_RE.match
        table: tuple[str, ...] = ()
        closing: str | None = None  # the delimiter of the multi-line string we are in
        depth = 0  # bracket depth of a multi-line value
        for lineno, raw in enumerate(text.split("\n"), 1):
            rest = raw
            if closing is not None:
                end = raw.find(closing)
                if end < 0:
                    continue
                closing = None
                rest = raw[end + 3 :]
            elif depth == 0:
                stripped = raw.lstrip(" \t")
                if not stripped or stripped[0] == "#":
                    continue
                if stripped[0] == "[":
                    m = _HEADER_RE.match(stripped)
                    if m is not None:
                        table = _split_key(m.group(2))
                        self._record(table, lineno)
                    continue
                m = assign(stripped)
                if m is None:
                    continue
                dotted = m.group(1)
                key = keys.get(dotted)
                if key is None:
                    key = keys[dotted] = _split_key(dotted)
                path = table + key
                if path not in lines:
                    if len(key) == 1:
                        lines[path] = lineno
                    else:
                        self._record(path, lineno)
                rest = stripped[m.end() :]
                if (  # the usual one-line value: nothing can be left open
                    '"""' not in rest
                    and "'''" not in rest
                    and rest.count("[") == rest.count("]")
                    and rest.count("{") == rest.count("}")
                ):
                    continue
            closing, depth = self._scan_value(rest, depth)

    @staticmethod
    def _scan_value(rest: str, depth: int) -> tuple[str | None, int]:
        """Follow brackets and strings to the end of the line; say what is left open."""
        pos = 0
        while True:
            m = _VALUE_TOKEN_RE.search(rest, pos)
            if m is None:
                return None, depth
            tok = m.group(0)
            if tok == "#":
                return None, depth
            if tok in ('"""', "'''"):
                end = rest.find(tok, m.end())
                if end < 0:
                    return tok, depth
                pos = end + 3
                continue
            if tok in "[{":
                depth += 1
            elif tok in "]}":
                depth = max(depth - 1, 0)
            pos = m.end()

    def line(self, *path: str) -> int:
        """The line of ``path``, or of its longest recorded prefix; 1 when nothing is known."""
        lines = self._lines
        for i in range(len(path), 0, -1):
            found = lines.get(path[:i])
            if found is not None:
                return found
        return 1


class ArrayLines:
    """Line numbers of a config file (the relay's, the notify config): its tables through a
    :class:`LineIndex`, and each entry of one array of tables (``[[routes]]``, ``[[rules]]``) told
    apart (a LineIndex records the first entry of an array only)."""

    def __init__(self, text: str, array: str) -> None:
        self.index = LineIndex(text)
        self.entries: list[tuple[int, LineIndex]] = []
        lines = text.split("\n")
        header = re.compile(rf"\s*\[\[\s*{re.escape(array)}\s*\]\]")
        starts = [k for k, raw in enumerate(lines) if header.match(raw)]
        for pos, start in enumerate(starts):
            end = len(lines)
            for k in range(start + 1, len(lines)):
                if re.match(r"\s*\[", lines[k]):
                    end = k
                    break
            if pos + 1 < len(starts):
                end = min(end, starts[pos + 1])
            self.entries.append((start + 1, LineIndex("\n".join(lines[start + 1 : end]))))
        self.array = array

    def line(self, *path: str) -> int:
        return self.index.line(*path)

    def entry_line(self, position: int, key: str | None = None) -> int:
        """The line of entry ``position`` (from 0) of the array, or of its ``key``."""
        if position >= len(self.entries):
            return self.index.line(self.array)
        header, index = self.entries[position]
        return header if key is None else header + index.line(key)
