"""Schedule files -> validated, frozen specs; diagnostics with file and line. Pure: no database.

    result = load_paths(["schedules/"], now=clock.wall())
    for d in result.errors + result.warnings:
        print(d.render())
    specs = load_valid(["schedules/"], now=clock.wall())  # or ScheduleError(diagnostics)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cronkeeper.schedule.diagnostics import Diagnostic, Severity, safe
    from cronkeeper.schedule.loader import LoadResult, load_paths, load_valid
    from cronkeeper.schedule.model import (
        NAME_PATTERN,
        Backoff,
        Misfire,
        Overlap,
        ScheduleSet,
        ScheduleSpec,
        canonical_json,
    )

# Loaded on first use (PEP 562): a command that only reads stored figures (`status` with the
# leader's summary) imports cronkeeper.schedule.diagnostics without the loader and its rules.
_HOMES = {
    "Diagnostic": "diagnostics", "Severity": "diagnostics", "safe": "diagnostics",
    "LoadResult": "loader", "load_paths": "loader", "load_valid": "loader",
    "NAME_PATTERN": "model", "Backoff": "model", "Misfire": "model", "Overlap": "model",
    "ScheduleSet": "model", "ScheduleSpec": "model", "canonical_json": "model",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'cronkeeper.schedule' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cronkeeper.schedule.{home}"), name)


__all__ = [
    "NAME_PATTERN",
    "Backoff",
    "Diagnostic",
    "LoadResult",
    "Misfire",
    "Overlap",
    "ScheduleSet",
    "ScheduleSpec",
    "Severity",
    "canonical_json",
    "load_paths",
    "load_valid",
    "safe",
]
