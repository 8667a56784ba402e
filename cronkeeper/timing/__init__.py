"""Cron grammar (with ``H``, ``L`` and ``#``), ``every``, timezones and DST rules (docs/schedules.md). Pure: time is always an argument.

Imports nothing from cronkeeper.db, cronkeeper.cli or cronkeeper.worker.
"""

from cronkeeper.timing.cron import CronExpr, parse_cron
from cronkeeper.timing.dst import AnomalyKind, DstAnomaly, dst_anomalies
from cronkeeper.timing.durations import parse_duration
from cronkeeper.timing.errors import TimingError
from cronkeeper.timing.hashed import field_hash, resolve, uses_hash
from cronkeeper.timing.instants import parse_instant
from cronkeeper.timing.triggers import CronTrigger, EveryTrigger, Trigger, make_trigger
from cronkeeper.timing.zones import deprecated_zone_alias, load_zone, tzdata_version

__all__ = [
    "AnomalyKind",
    "CronExpr",
    "CronTrigger",
    "DstAnomaly",
    "EveryTrigger",
    "Trigger",
    "TimingError",
    "deprecated_zone_alias",
    "dst_anomalies",
    "field_hash",
    "load_zone",
    "make_trigger",
    "parse_cron",
    "parse_duration",
    "parse_instant",
    "resolve",
    "tzdata_version",
    "uses_hash",
]
