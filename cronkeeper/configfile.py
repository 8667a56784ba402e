"""What the TOML config files other than schedule files share (the relay's, docs/relay.md; the
notify config, docs/notifications.md): reading one without ever raising, and collecting every
problem as a ``Diagnostic`` with its line (validate's format), with a did-you-mean for an
unknown name. Pure: reads a file, imports no database or network library."""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from cronkeeper.schedule.diagnostics import Diagnostic, Severity
from cronkeeper.schedule.lines import ArrayLines

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ConfigResult(Generic[T]):
    """A config file as checked: its value (None when it has an error) and every problem found."""

    config: T | None
    diagnostics: tuple[Diagnostic, ...]

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity is Severity.WARNING]


def read_toml(path: str) -> tuple[bytes, str, dict[str, Any]] | Diagnostic:
    """(the bytes, the text, the table) of a TOML file, or the one problem that stops it being
    read at all (unreadable, not UTF-8, a syntax error with its line)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return Diagnostic(path, 0, None, f"cannot read: {exc.strerror}")
    try:
        text = data.decode("utf-8")
        return data, text, tomllib.loads(text)
    except UnicodeDecodeError:
        return Diagnostic(path, 0, None, "not UTF-8 text")
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        if not line:
            match = re.search(r"line (\d+)", str(exc))
            line = int(match[1]) if match else 1
        return Diagnostic(path, line, None, f"TOML syntax: {exc}")


class ConfigReader:
    """Collects the problems of one config file; ``where`` locates its tables and the entries
    of its array of tables (``array``: ``routes``, ``rules``)."""

    def __init__(self, path: str, text: str, array: str) -> None:
        self.path = path
        self.where = ArrayLines(text, array)
        self.found: list[Diagnostic] = []

    def error(self, line: int, message: str) -> None:
        self.found.append(Diagnostic(self.path, line, None, message))

    def warn(self, line: int, message: str) -> None:
        self.found.append(Diagnostic(self.path, line, None, message, Severity.WARNING))

    def unknown(self, line: int, where: str, key: str, known: tuple[str, ...], *,
                what: str = "key") -> None:
        """``where``unknown ``what`` '``key``', with the closest known name or the list."""
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})"
        self.error(line, f"{where}unknown {what} '{key}'{hint}")

    def globs(self, pos: int, entry: dict, key: str, noun: str,
              example: str) -> tuple[str, ...] | None:
        """Entry ``pos``'s list of glob strings under ``key`` (None: not given, or not such a
        list, which is an error naming the entry as ``noun N``)."""
        if key not in entry:
            return None
        value = entry[key]
        if (not isinstance(value, list) or not value
                or not all(isinstance(g, str) and g for g in value)):
            self.error(self.where.entry_line(pos, key), f"{noun} {pos + 1}: {key}: expected a "
                       f"non-empty list of glob strings, e.g. [\"{example}\"]")
            return None
        return tuple(value)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.found if d.severity is Severity.ERROR]
