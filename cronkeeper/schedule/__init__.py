"""Schedule files -> validated, frozen specs; diagnostics with file and line. Pure: no database.

    result = load_paths(["schedules/"], now=clock.wall())
    for d in result.errors + result.warnings:
        print(d.render())
    specs = load_valid(["schedules/"], now=clock.wall())  # or ScheduleError(diagnostics)
"""

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
