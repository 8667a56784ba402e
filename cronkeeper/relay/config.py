"""The relay config file (docs/relay.md): named targets and an ordered list of routes, read into frozen
values with every problem reported at once as ``file:line: message`` (the schedule files' format).

Pure: reads a file, imports no database or queue library. A target kind may check its own
settings: its module (``cronkeeper.relay.targets.KIND``) may expose ``check(settings) ->
list[tuple[key, message]]``; it must import its queue library lazily so validation stays light.

Globs are ``fnmatch`` globs, matched case-sensitively; :func:`glob_regex` translates them into the
anchored PostgreSQL regular expressions the claims match (one translation, tested against
``fnmatchcase``).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from cronkeeper.configfile import ConfigReader, ConfigResult, read_toml
from cronkeeper.relay.targets import KINDS
from cronkeeper.schedule.diagnostics import Diagnostic, Severity
from cronkeeper.schedule.lines import ArrayLines
from cronkeeper.timing.durations import parse_duration
from cronkeeper.timing.errors import TimingError

TOP_KEYS = ("name", "lease", "batch_size", "poll_interval", "status_interval", "targets", "routes")
ROUTE_KEYS = ("tasks", "schedules", "target", "queue", "options")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
MAX_LEASE = 3600.0


@dataclass(frozen=True, slots=True)
class TargetConfig:
    name: str
    kind: str
    settings: tuple[tuple[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.settings)


@dataclass(frozen=True, slots=True)
class Route:
    """One ``[[routes]]`` entry. A job matches when its task matches one of ``tasks`` (if given)
    and its schedule one of ``schedules`` (if given)."""

    position: int
    target: str
    tasks: tuple[str, ...] | None
    schedules: tuple[str, ...] | None
    queue: str | None = None
    options: tuple[tuple[str, Any], ...] = ()

    def matches(self, task: str, schedule: str | None) -> bool:
        if self.tasks is not None and not any(fnmatchcase(task, g) for g in self.tasks):
            return False
        return self.schedules is None or any(fnmatchcase(schedule or "", g) for g in self.schedules)

    @property
    def task_regex(self) -> str | None:
        return None if self.tasks is None else globs_regex(self.tasks)

    @property
    def schedule_regex(self) -> str | None:
        return None if self.schedules is None else globs_regex(self.schedules)


@dataclass(frozen=True, slots=True)
class RelayConfig:
    path: str
    name: str
    targets: tuple[TargetConfig, ...]
    routes: tuple[Route, ...]
    lease: float = 60.0
    batch_size: int = 100
    poll_interval: float = 1.0
    status_interval: float = 2.0
    digest: str = ""  # of the file's bytes: relays of one name should show one digest

    def route_for(self, task: str, schedule: str | None) -> Route | None:
        """The first route that matches, or None (the job stays for ``cronkeeper worker``)."""
        for route in self.routes:
            if route.matches(task, schedule):
                return route
        return None

    def target(self, name: str) -> TargetConfig:
        return next(t for t in self.targets if t.name == name)


# -- globs -------------------------------------------------------------------------------------

_SPECIAL = set(r".^$*+?()[]{}|\-/")


def glob_regex(glob: str) -> str:
    """The body of a PostgreSQL ARE that matches what ``fnmatchcase(name, glob)`` matches."""
    out: list[str] = []
    i, n = 0, len(glob)
    while i < n:
        ch = glob[i]
        i += 1
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "[":
            j = i
            if j < n and glob[j] == "!":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal "[", as fnmatch reads it
                out.append("\\[")
                continue
            body = glob[i:j]
            i = j + 1
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            out.append("[" + ("^" if negate else "") + _bracket(body) + "]")
        else:
            out.append("\\" + ch if ch in _SPECIAL else ch)
    return "".join(out)


def _bracket(body: str) -> str:
    """A bracket expression's members: ranges stay ranges, ``\\``, ``[`` and ``^`` are escaped."""
    out = []
    for k, ch in enumerate(body):
        if ch in "\\[" or (ch == "^" and k == 0):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def globs_regex(globs: tuple[str, ...]) -> str:
    return "^(?:" + "|".join(glob_regex(g) for g in globs) + ")$"


# -- reading -------------------------------------------------------------------------------------


class _Reader(ConfigReader):
    def __init__(self, path: str, text: str) -> None:
        super().__init__(path, text, "routes")

    def duration(self, raw: dict, key: str, default: float) -> float:
        if key not in raw:
            return default
        try:
            value = parse_duration(raw[key])
        except TimingError as exc:
            self.error(self.where.line(key), f"{key}: {exc}")
            return default
        if value <= 0:
            self.error(self.where.line(key), f"{key}: must be more than 0s")
            return default
        return value


def load_relay_config(path: str) -> ConfigResult[RelayConfig]:
    """Read and check a relay config; never raises for any file content."""
    read = read_toml(path)
    if isinstance(read, Diagnostic):
        return ConfigResult(None, (read,))
    data, text, raw = read
    reader = _Reader(path, text)
    config = dataclasses.replace(_read(reader, raw),
                                 digest=hashlib.sha256(data).hexdigest()[:16])
    return ConfigResult(None if reader.errors else config, tuple(reader.found))


def _read(r: _Reader, raw: dict[str, Any]) -> RelayConfig:
    for key in raw:
        if key not in TOP_KEYS:
            r.unknown(r.where.line(key), "", key, TOP_KEYS)
    name = raw.get("name", "default")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        r.error(r.where.line("name"), "name: expected a name like 'celery-relay' "
                "([a-z0-9][a-z0-9._-]*, at most 128 characters)")
        name = "default"
    lease = r.duration(raw, "lease", 60.0)
    if lease > MAX_LEASE:
        r.error(r.where.line("lease"), f"lease: at most {MAX_LEASE:g}s (a relay's lease covers "
                "one publish, not the job's run)")
    batch = raw.get("batch_size", 100)
    if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= 10000:
        r.error(r.where.line("batch_size"), "batch_size: expected an integer from 1 to 10000")
        batch = 100
    targets = _targets(r, raw.get("targets", {}))
    routes = _routes(r, raw.get("routes", []), [t.name for t in targets])
    used = {route.target for route in routes}
    for target in targets:
        if target.name not in used:
            r.warn(r.where.line("targets", target.name), f"target '{target.name}': no route "
                   "sends jobs to it")
    if not routes and "routes" not in raw:
        r.warn(1, "no [[routes]]: this relay publishes nothing (every job stays for "
               "cronkeeper worker)")
    return RelayConfig(
        path=r.path, name=name, targets=tuple(targets), routes=tuple(routes), lease=lease,
        batch_size=batch, poll_interval=r.duration(raw, "poll_interval", 1.0),
        status_interval=r.duration(raw, "status_interval", 2.0),
    )


def _targets(r: _Reader, raw: Any) -> list[TargetConfig]:
    if not isinstance(raw, dict):
        r.error(r.where.line("targets"), "targets: expected tables like [targets.NAME]")
        return []
    found = []
    for name, settings in raw.items():
        line = r.where.line("targets", name)
        if not isinstance(settings, dict):
            r.error(line, f"target '{name}': expected a table [targets.{name}]")
            continue
        if not NAME_RE.fullmatch(name):
            r.error(line, f"target '{name}': names are [a-z0-9][a-z0-9._-]*")
        kind = settings.get("kind")
        if kind is None:
            r.error(line, f"target '{name}': missing key 'kind' (one of: {', '.join(KINDS)})")
            continue
        if kind not in KINDS:
            close = difflib.get_close_matches(str(kind), list(KINDS), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (one of: {', '.join(KINDS)})"
            r.error(r.where.line("targets", name, "kind"), f"target '{name}': unknown kind "
                    f"'{kind}'{hint}")
            continue
        for key, message in _check_kind(kind, settings):
            r.error(r.where.line("targets", name, key), f"target '{name}': {message}")
        found.append(TargetConfig(name, kind, tuple(settings.items())))
    return found


def _check_kind(kind: str, settings: dict[str, Any]) -> list[tuple[str, str]]:
    try:
        module = importlib.import_module(KINDS[kind])
    except ImportError:
        return []  # the kind's module is not there (yet): its build() will say so at start
    check = getattr(module, "check", None)
    return list(check(settings)) if check is not None else []


def _routes(r: _Reader, raw: Any, targets: list[str]) -> list[Route]:
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        r.error(r.where.line("routes"), "routes: expected [[routes]] tables")
        return []
    found = []
    for pos, route in enumerate(raw):
        line = r.where.entry_line(pos)
        for key in route:
            if key not in ROUTE_KEYS:
                r.unknown(r.where.entry_line(pos, key), f"route {pos + 1}: ", key, ROUTE_KEYS)
        tasks = r.globs(pos, route, "tasks", "route", "billing.*")
        schedules = r.globs(pos, route, "schedules", "route", "billing.*")
        if "tasks" not in route and "schedules" not in route:
            r.error(line, f"route {pos + 1}: give 'tasks' or 'schedules' globs (or both); a "
                    "route that matches every job would take them all from cronkeeper worker: "
                    "write tasks = [\"*\"] if that is meant")
        target = route.get("target")
        if target is None:
            r.error(line, f"route {pos + 1}: missing key 'target'")
            continue
        if target not in targets:
            close = difflib.get_close_matches(str(target), targets, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            r.error(r.where.entry_line(pos, "target"), f"route {pos + 1}: no target named "
                    f"'{target}'{hint}")
            continue
        queue = route.get("queue")
        if queue is not None and (not isinstance(queue, str) or not queue):
            r.error(r.where.entry_line(pos, "queue"), f"route {pos + 1}: queue: expected a name")
            queue = None
        options = route.get("options", {})
        if not isinstance(options, dict):
            r.error(r.where.entry_line(pos, "options"), f"route {pos + 1}: options: expected a "
                    "table, e.g. { exchange = \"billing\", routing_key = \"invoices\" }")
            options = {}
        found.append(Route(pos, target, tasks, schedules, queue, tuple(options.items())))
    return found


def check_against_schedules(config: RelayConfig, specs: dict[str, Any], path: str) -> list[Diagnostic]:
    """With schedule files given too: a route that would relay a ``command`` schedule is an error
    (only ``cronkeeper worker`` runs commands, from its own schedule files); a route no schedule
    matches is a warning (applications may still enqueue such jobs)."""
    with open(path, encoding="utf-8") as fh:
        where = ArrayLines(fh.read(), "routes")
    found = []
    for route in config.routes:
        hits = [s for s in specs.values() if route.matches(s.task_name, s.name)]
        for spec in hits:
            if getattr(spec, "command", None):
                found.append(Diagnostic(path, where.entry_line(route.position), spec.name,
                                        f"route {route.position + 1} would relay this schedule, "
                                        "but it runs a command: only cronkeeper worker runs "
                                        "commands"))
        if not hits:
            found.append(Diagnostic(path, where.entry_line(route.position), None,
                                    f"route {route.position + 1}: matches no schedule in the "
                                    "given files", Severity.WARNING))
    return found

