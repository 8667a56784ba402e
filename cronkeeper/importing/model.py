"""What an importer produces: converted entries, and every problem with where it came from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cronkeeper.errors import UnusableInput

__all__ = ["Conversion", "Entry", "Problem", "UnusableInput"]


@dataclass(frozen=True, slots=True)
class Problem:
    """One line or entry not converted (``left_out``), or converted with a caveat."""

    where: str  # "FILE:LINE" or "entry NAME"
    message: str
    left_out: bool = True

    def render(self) -> str:
        return f"{self.where}: {self.message}" if self.left_out else (
            f"{self.where}: warning: {self.message}"
        )


@dataclass(frozen=True, slots=True)
class Entry:
    """One schedule to write: its keys in output order, and the comments above it."""

    name: str
    where: str
    keys: tuple[tuple[str, Any], ...]
    notes: tuple[str, ...] = ()
    # For --compare: what the old system ran (cron fields, zone; or the Celery schedule object).
    old: Any = field(default=None, compare=False)
    queue: str | None = None  # Celery: the queue its options named (for the relay suggestion)

    def get(self, key: str) -> Any:
        return dict(self.keys).get(key)


@dataclass(frozen=True, slots=True)
class Conversion:
    source: str  # what was read, for the file header
    header: tuple[str, ...]
    entries: tuple[Entry, ...]
    problems: tuple[Problem, ...]
    stem: str  # output file name without .toml
    extra: tuple[tuple[str, str], ...] = ()  # (file name, text): e.g. a suggested relay config
    # Builds ``extra`` from the entries that survive validation (render calls it).
    extra_for: Callable[[tuple[Entry, ...]], tuple[tuple[str, str], ...]] | None = field(
        default=None, compare=False
    )

    @property
    def left_out(self) -> int:
        return sum(1 for p in self.problems if p.left_out)
