"""Frozen schedule specs: what a schedule file means once it has been validated."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import sys
from dataclasses import dataclass, field
from datetime import date
from enum import StrEnum
from typing import Any, overload

from cronkeeper import backoff as backoff_defaults
from cronkeeper.errors import UnreadableVersion
from cronkeeper.timing import Trigger, make_trigger, resolve
from cronkeeper.timing.calendars import Calendar, moved_trigger

NAME_PATTERN = r"[a-z0-9][a-z0-9._-]{0,127}"


class Misfire(StrEnum):
    SKIP = "skip"
    CATCH_UP = "catch_up"
    LATEST = "latest"


class Overlap(StrEnum):
    SKIP = "skip"
    ALLOW = "allow"
    SERIAL = "serial"


class OnCalendar(StrEnum):
    """What happens to a period on a date the schedule's calendar lists: it is skipped (reason
    ``calendar``); with ``next_day`` its time of day also fires on the next unlisted day."""

    SKIP = "skip"
    NEXT_DAY = "next_day"


# Defaults of §2: the background-job rules (30 s base, factor 2, full jitter, 5 attempts).
DEFAULT_CATCH_UP_LIMIT = 24 * 3600.0
DEFAULT_GRACE = 60.0
DEFAULT_JITTER = 0.0
DEFAULT_TIMEOUT = 600.0
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE = backoff_defaults.DEFAULT_BASE
DEFAULT_BACKOFF_FACTOR = backoff_defaults.DEFAULT_FACTOR
DEFAULT_BACKOFF_MAX = backoff_defaults.DEFAULT_MAX
MAX_PAYLOAD_BYTES = 8 * 1024
DEFAULT_OUTPUT_LIMIT = 64 * 1024  # bytes of each attempt's output kept (cronkeeper.output)
MAX_OUTPUT_LIMIT = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Backoff:
    base: float = DEFAULT_BACKOFF_BASE
    factor: float = DEFAULT_BACKOFF_FACTOR
    max: float = DEFAULT_BACKOFF_MAX


@functools.lru_cache(maxsize=1024)
def shared_backoff(base: float = DEFAULT_BACKOFF_BASE, factor: float = DEFAULT_BACKOFF_FACTOR,
                   max: float = DEFAULT_BACKOFF_MAX) -> Backoff:  # noqa: A002 - the field's name
    """One Backoff instance per distinct value: 100,000 schedules mostly share a handful."""
    return Backoff(base, factor, max)


@overload
def shared_text(value: str) -> str: ...
@overload
def shared_text(value: str | None) -> str | None: ...
def shared_text(value: str | None) -> str | None:
    """The interned string: zones, tasks, owners and payloads repeat across generated
    schedules, and each copy would cost its own 50-100 bytes per schedule."""
    return sys.intern(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """One validated schedule. Durations are in seconds. ``payload_json`` is canonical JSON."""

    name: str
    timezone: str
    misfire: Misfire
    cron: str | None = None
    every: float | None = None
    catch_up_limit: float = DEFAULT_CATCH_UP_LIMIT
    overlap: Overlap = Overlap.SKIP
    task: str | None = None
    command: tuple[str, ...] | None = None
    payload_json: str = "{}"
    grace: float = DEFAULT_GRACE
    jitter: float = DEFAULT_JITTER
    timeout: float = DEFAULT_TIMEOUT
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Backoff = field(default_factory=Backoff)
    permanent_exit_codes: tuple[int, ...] = ()
    owner: str | None = None
    description: str | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT  # bytes; 0 keeps nothing
    # The dates it does not fire on, resolved from the calendar it names (the loader resolves
    # the name once every file is read: calendars may be defined in any file).
    calendar: Calendar | None = None
    on_calendar: OnCalendar = OnCalendar.SKIP
    # Where it came from; not part of the spec's identity (moving a schedule between files
    # does not make a new version).
    file: str = field(default="", compare=False)
    line: int = field(default=0, compare=False)
    # The digest, worked out once (adopt and every heartbeat's set digest read it).
    _digest: str | None = field(default=None, init=False, compare=False, repr=False)

    def renamed(
        self, name: str, task: str | None, description: str | None, file: str, line: int
    ) -> ScheduleSpec:
        """This spec under another name, task and description, from another place: how the
        loader makes the specs of tables that differ from one already checked only in those.
        Positional, every field: a third of the cost of ``dataclasses.replace``."""
        return ScheduleSpec(
            name, self.timezone, self.misfire, self.cron, self.every, self.catch_up_limit,
            self.overlap, task, self.command, self.payload_json, self.grace, self.jitter,
            self.timeout, self.max_attempts, self.backoff, self.permanent_exit_codes, self.owner,
            description, self.output_limit, self.calendar, self.on_calendar, file, line,
        )  # fmt: skip

    def with_calendar(self, calendar: Calendar) -> ScheduleSpec:
        """This spec with the dates of the calendar it names (how the loader resolves it)."""
        return dataclasses.replace(self, calendar=calendar)

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.payload_json)

    @property
    def task_name(self) -> str:
        """What the outbox row's ``task`` column says: the task, or ``command`` for argv jobs."""
        return self.task if self.task is not None else "command"

    def to_json(self) -> dict[str, Any]:
        """Readable JSON, stored with every schedule version so audits are plain SQL.
        ``output_limit`` only when it is not the default: a spec that does not set it keeps
        the digest it had before the key existed (so no schedule becomes a new version, and a
        worker of the previous release runs its commands in a mixed fleet). A schedule with a
        calendar also holds ``calendar`` (its name and every date) and ``on_calendar``; one
        without holds neither key, for the same reason."""
        doc: dict[str, Any] = {
            "name": self.name,
            "cron": self.cron,
            "every": self.every,
            "timezone": self.timezone,
            "misfire": str(self.misfire),
            "catch_up_limit": self.catch_up_limit,
            "overlap": str(self.overlap),
            "task": self.task,
            "command": list(self.command) if self.command is not None else None,
            "payload": self.payload,
            "grace": self.grace,
            "jitter": self.jitter,
            "timeout": self.timeout,
            "max_attempts": self.max_attempts,
            "backoff": {
                "base": self.backoff.base,
                "factor": self.backoff.factor,
                "max": self.backoff.max,
            },
            "permanent_exit_codes": list(self.permanent_exit_codes),
            "owner": self.owner,
            "description": self.description,
        }
        if self.output_limit != DEFAULT_OUTPUT_LIMIT:
            doc["output_limit"] = self.output_limit
        if self.calendar is not None:
            doc["calendar"] = self.calendar.to_json()
            doc["on_calendar"] = str(self.on_calendar)
        return doc

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScheduleSpec:
        backoff = data.get("backoff") or {}
        command = data.get("command")
        return cls(
            name=data["name"],
            cron=shared_text(data.get("cron")),
            every=data.get("every"),
            timezone=shared_text(data["timezone"]),
            misfire=Misfire(data["misfire"]),
            catch_up_limit=float(data.get("catch_up_limit", DEFAULT_CATCH_UP_LIMIT)),
            overlap=Overlap(data.get("overlap", "skip")),
            task=shared_text(data.get("task")),
            command=tuple(command) if command is not None else None,
            payload_json=shared_text(canonical_json(data.get("payload") or {})),
            grace=float(data.get("grace", DEFAULT_GRACE)),
            jitter=float(data.get("jitter", DEFAULT_JITTER)),
            timeout=float(data.get("timeout", DEFAULT_TIMEOUT)),
            max_attempts=int(data.get("max_attempts", DEFAULT_MAX_ATTEMPTS)),
            backoff=shared_backoff(
                float(backoff.get("base", DEFAULT_BACKOFF_BASE)),
                float(backoff.get("factor", DEFAULT_BACKOFF_FACTOR)),
                float(backoff.get("max", DEFAULT_BACKOFF_MAX)),
            ),
            permanent_exit_codes=tuple(data.get("permanent_exit_codes") or ()),
            owner=shared_text(data.get("owner")),
            description=shared_text(data.get("description")),
            output_limit=int(data.get("output_limit", DEFAULT_OUTPUT_LIMIT)),
            calendar=_calendar_from_json(data.get("calendar")),
            on_calendar=OnCalendar(data.get("on_calendar", "skip")),
        )

    @property
    def digest(self) -> str:
        found = self._digest
        return found if found is not None else self.canonical_and_digest()[1]

    def canonical_and_digest(self) -> tuple[str, str]:
        """``to_json()`` as canonical JSON text (what a version row stores) and its digest,
        from one serialisation. The text is not kept (400 B a schedule); the digest is."""
        text = self.canonical_text()
        digest = hashlib.sha256(text.encode()).hexdigest()
        object.__setattr__(self, "_digest", digest)  # a cache: frozen for everything else
        return text, digest

    def canonical_text(self) -> str:
        """``canonical_json(self.to_json())``, written field by field in its sorted key order:
        three times faster than building the dict and sorting it, and 100,000 of them stand
        between a daemon's start and its first heartbeat. tests/test_spec_rules.py holds the
        two equal over varied specs; the stored versions' digests depend on it."""
        b = self.backoff
        limit = self.output_limit
        calendar = self.calendar
        return _CANONICAL % (
            _json(b.base), _json(b.factor), _json(b.max),
            "" if calendar is None else f'"calendar":{calendar.canonical_json()},',
            _json(self.catch_up_limit),
            "null" if self.command is None else _json_list(self.command), _json(self.cron),
            _json(self.description), _json(self.every), _json(self.grace), _json(self.jitter),
            _json(self.max_attempts), _json(str(self.misfire)), _json(self.name),
            "" if calendar is None else f'"on_calendar":{_json(str(self.on_calendar))},',
            "" if limit == DEFAULT_OUTPUT_LIMIT else f'"output_limit":{_json(limit)},',
            _json(str(self.overlap)), _json(self.owner), _canonical_payload(self.payload_json),
            _json_list(self.permanent_exit_codes), _json(self.task), _json(self.timeout),
            _json(self.timezone),
        )  # fmt: skip

    @property
    def resolved_cron(self) -> str | None:
        """The cron with its ``H`` resolved for this schedule's name (``H 6 * * *`` ->
        ``37 6 * * *``): what it means, for people reading it. None for ``every``."""
        return resolve(self.cron, self.name) if self.cron is not None else None

    def trigger(self) -> Trigger:
        """When this schedule fires (the one place a spec becomes a trigger; the name is what
        a cron's ``H`` hashes). With ``on_calendar = "next_day"``, the fires on the dates its
        calendar lists also fire on the next unlisted day (``timing.calendars``)."""
        trigger = make_trigger(cron=self.cron, every=self.every, timezone=self.timezone,
                               name=self.name)
        if self.calendar is not None and self.on_calendar is OnCalendar.NEXT_DAY:
            return moved_trigger(trigger, self.calendar)
        return trigger


def read_stored_version(schedule: str, version_id: int, data: Any) -> tuple[ScheduleSpec, Trigger]:
    """The spec and trigger of a ``schedule_versions`` row, or UnreadableVersion naming the row:
    the leader, operator commands and the audit read stored versions through this one door."""
    try:
        if not isinstance(data, dict):
            raise ValueError(f"spec is {type(data).__name__}, not an object")
        spec = ScheduleSpec.from_json(data)
        return spec, spec.trigger()
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise UnreadableVersion(
            f"schedule {schedule!r}: stored version {version_id} cannot be read ({detail})"
        ) from None


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _calendar_from_json(data: Any) -> Calendar | None:
    """A stored spec's ``calendar`` (``{"name": ..., "dates": ["2026-12-25", ...]}``)."""
    if data is None:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("dates"), list):
        raise ValueError("calendar is not an object with a list of dates")
    return _stored_calendar(str(data["name"]), tuple(data["dates"]))


@functools.lru_cache(maxsize=256)
def _stored_calendar(name: str, dates: tuple[str, ...]) -> Calendar:
    return Calendar.of(name, [date.fromisoformat(d) for d in dates])


# ScheduleSpec.to_json()'s keys in sorted order, as canonical_json writes them. The keys that
# only some specs hold are a %s each, their text or nothing: after "backoff", ``"calendar":{...},``
# with a calendar; after "name", ``"on_calendar":"...",`` with a calendar, then
# ``"output_limit":N,`` when it is not the default.
_CANONICAL = (
    '{"backoff":{"base":%s,"factor":%s,"max":%s},%s"catch_up_limit":%s,"command":%s,"cron":%s,'
    '"description":%s,"every":%s,"grace":%s,"jitter":%s,"max_attempts":%s,"misfire":%s,'
    '"name":%s,%s%s"overlap":%s,"owner":%s,"payload":%s,"permanent_exit_codes":%s,"task":%s,'
    '"timeout":%s,"timezone":%s}'
)
_encode_str = json.encoder.encode_basestring_ascii  # what json.dumps writes a str with


def _json(value: Any) -> str:
    """One scalar as ``canonical_json`` writes it."""
    cls = type(value)
    if cls is str:
        return _encode_str(value)
    if value is None:
        return "null"
    if cls is float and value == value and value not in (math.inf, -math.inf):
        return float.__repr__(value)
    if cls is int:
        return int.__repr__(value)
    return canonical_json(value)  # bools, NaN (refused), anything unusual: the general path


def _json_list(values: Any) -> str:
    return "[" + ",".join(map(_json, values)) + "]"


@functools.lru_cache(maxsize=4096)
def _canonical_payload(payload_json: str) -> str:
    """The payload as ``to_json()`` holds it and canonical_json writes it (the stored text is
    canonical already when the loader made it; a spec built by hand may not be)."""
    return canonical_json(json.loads(payload_json))


@dataclass(frozen=True, slots=True)
class ScheduleSet:
    """Every schedule of a directory, by name, and the digest that instances compare."""

    specs: tuple[ScheduleSpec, ...]
    # Every calendar the files define, with its file: the leader records them for runtime
    # specs to name (docs/runtime-schedules.md). Used ones are in their schedules' digests.
    calendars: tuple[tuple[Calendar, str], ...] = field(default=(), compare=False)
    _digest: str | None = field(default=None, init=False, compare=False, repr=False)

    def by_name(self) -> dict[str, ScheduleSpec]:
        return {s.name: s for s in self.specs}

    @property
    def digest(self) -> str:
        """Computed once: instances report it with every heartbeat."""
        if self._digest is not None:
            return self._digest
        h = hashlib.sha256()
        for spec in sorted(self.specs, key=lambda s: s.name):
            h.update(spec.name.encode())
            h.update(spec.digest.encode())
        digest = h.hexdigest()[:16]
        object.__setattr__(self, "_digest", digest)  # a cache: frozen for everything else
        return digest
