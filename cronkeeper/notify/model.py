"""The notify config's values (docs/notifications.md): events, sinks, rules and the retry and
heartbeat settings, frozen. :mod:`cronkeeper.notify.config` reads them from a file and checks
them; the sender and the sinks use them. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any

ADDRESS_RE = re.compile(r"[^@\s<>,;\"]+@[^@\s<>,;\"]+")


class Event(StrEnum):
    DEAD = "dead"
    MISSED = "missed"
    MISSING = "missing"
    RECOVERED = "recovered"


class SinkKind(StrEnum):
    SLACK = "slack"
    WEBHOOK = "webhook"
    EMAIL = "email"
    APPRISE = "apprise"


# Retries: by default at least 10 tries over at least 10 minutes (docs/notifications.md).
DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_RETRY_FOR = 600.0
DEFAULT_BACKOFF = (10.0, 2.0, 300.0)  # base, factor, max (seconds), with full jitter
DEFAULT_TIMEOUT = {SinkKind.SLACK: 10.0, SinkKind.WEBHOOK: 10.0, SinkKind.EMAIL: 30.0,
                   SinkKind.APPRISE: 30.0}
DEFAULT_HEARTBEAT_INTERVAL = 60.0


def is_address(text: str | None) -> bool:
    """Whether ``text`` is an e-mail address (an owner the crontab importer took from MAILTO)."""
    return bool(text) and ADDRESS_RE.fullmatch(text or "") is not None


@dataclass(frozen=True, slots=True)
class Sink:
    """One ``[sinks.NAME]`` table. ``settings``: its keys as written (minus ``kind``)."""

    name: str
    kind: SinkKind
    settings: tuple[tuple[str, Any], ...]
    timeout: float

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.settings).get(key, default)

    def env_names(self) -> list[str]:
        """The environment variables the sink reads its secrets from."""
        return [v for k, v in self.settings if k.endswith("_env")]


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``[[rules]]`` entry: events, globs (None: any), the sink it sends to."""

    position: int
    events: frozenset[Event]
    owners: tuple[str, ...] | None
    schedules: tuple[str, ...] | None
    tasks: tuple[str, ...] | None
    sink: str

    def matches(self, event: str, schedule: str | None, task: str | None,
                owner: str | None) -> bool:
        if event not in self.events:
            return False
        for globs, value in ((self.owners, owner), (self.schedules, schedule),
                             (self.tasks, task)):
            if globs is not None and not any(fnmatchcase(value or "", g) for g in globs):
                return False
        return True


@dataclass(frozen=True, slots=True)
class NotifyConfig:
    path: str
    sinks: tuple[Sink, ...]
    rules: tuple[Rule, ...]
    heartbeat_url: str | None = None
    heartbeat_url_env: str | None = None
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_for: float = DEFAULT_RETRY_FOR
    backoff: tuple[float, float, float] = DEFAULT_BACKOFF
    digest: str = ""

    def sinks_for(self, event: str, schedule: str | None, task: str | None,
                  owner: str | None) -> list[Sink]:
        """The sinks the matching rules send to, in rule order, each once: every matching rule
        sends once per event (two rules naming one sink send to it once)."""
        by_name = {s.name: s for s in self.sinks}
        found: list[Sink] = []
        for rule in self.rules:
            sink = by_name[rule.sink]
            if sink not in found and rule.matches(event, schedule, task, owner):
                found.append(sink)
        return found

    @property
    def lease(self) -> float:
        """A sender's lease on one notification: long enough for one sink's send, renewed as
        each sink answers (``db/notifications.py``, notifications_delivered)."""
        return 2 * max((s.timeout for s in self.sinks), default=10.0) + 5.0
