"""The notify config (docs/notifications.md): named sinks, rules, retries and the heartbeat URL,
read into frozen values (:mod:`cronkeeper.notify.model`) with every problem reported at once as
``file:line: message`` (the schedule files' format, ``cronkeeper validate --notify-config``).

Pure: reads a file, imports no database or network library. Secrets are never in the file: a
sink names the environment variable that holds them (``url_env``, ``secret_env``,
``password_env``), and :func:`environment_problems` says which of those a process lacks.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from cronkeeper.configfile import ConfigReader, ConfigResult, read_toml
from cronkeeper.notify.model import (
    DEFAULT_BACKOFF,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_RETRY_FOR,
    DEFAULT_TIMEOUT,
    Event,
    NotifyConfig,
    Rule,
    Sink,
    SinkKind,
    is_address,
)
from cronkeeper.schedule.diagnostics import Diagnostic, Severity
from cronkeeper.timing.durations import parse_duration
from cronkeeper.timing.errors import TimingError

TOP_KEYS = ("heartbeat_url", "heartbeat_url_env", "heartbeat_interval", "max_attempts",
            "retry_for", "backoff", "sinks", "rules")
SINK_KEYS: dict[SinkKind, tuple[str, ...]] = {
    SinkKind.SLACK: ("kind", "url_env", "timeout"),
    SinkKind.WEBHOOK: ("kind", "url", "url_env", "secret_env", "timeout"),
    SinkKind.EMAIL: ("kind", "smtp", "from", "to", "to_owner", "user_env", "password_env",
                     "ca_file", "timeout"),
    SinkKind.APPRISE: ("kind", "url_env", "timeout"),
}
RULE_KEYS = ("events", "owners", "schedules", "tasks", "sink")
BACKOFF_KEYS = ("base", "factor", "max")
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Reader(ConfigReader):
    def __init__(self, path: str, text: str) -> None:
        super().__init__(path, text, "rules")

    def duration(self, value: Any, line: int, what: str, default: float) -> float:
        try:
            seconds = parse_duration(value)
        except TimingError as exc:
            self.error(line, f"{what}: {exc}")
            return default
        if seconds <= 0:
            self.error(line, f"{what}: must be more than 0s")
            return default
        return seconds


def load_notify_config(path: str) -> ConfigResult[NotifyConfig]:
    """Read and check a notify config; never raises for any file content."""
    read = read_toml(path)
    if isinstance(read, Diagnostic):
        return ConfigResult(None, (read,))
    data, text, raw = read
    reader = _Reader(path, text)
    config = dataclasses.replace(_read(reader, raw), digest=hashlib.sha256(data).hexdigest()[:16])
    return ConfigResult(None if reader.errors else config, tuple(reader.found))


def _read(r: _Reader, raw: dict[str, Any]) -> NotifyConfig:
    for key in raw:
        if key not in TOP_KEYS:
            r.unknown(r.where.line(key), "", key, TOP_KEYS)
    heartbeat_url = raw.get("heartbeat_url")
    heartbeat_env = raw.get("heartbeat_url_env")
    if heartbeat_url is not None and heartbeat_env is not None:
        r.error(r.where.line("heartbeat_url_env"), "give heartbeat_url or heartbeat_url_env, "
                "not both")
    if heartbeat_url is not None and not _http_url(heartbeat_url):
        r.error(r.where.line("heartbeat_url"), "heartbeat_url: expected an http:// or https:// "
                "URL, e.g. \"https://hc-ping.com/<uuid>\"")
        heartbeat_url = None
    if heartbeat_env is not None and not _env_name(r, heartbeat_env, r.where.line(
            "heartbeat_url_env"), "heartbeat_url_env"):
        heartbeat_env = None
    interval = DEFAULT_HEARTBEAT_INTERVAL
    if "heartbeat_interval" in raw:
        interval = r.duration(raw["heartbeat_interval"], r.where.line("heartbeat_interval"),
                              "heartbeat_interval", interval)
        if heartbeat_url is None and heartbeat_env is None:
            r.warn(r.where.line("heartbeat_interval"), "heartbeat_interval without "
                   "heartbeat_url: nothing is pinged")
    attempts = raw.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    if not isinstance(attempts, int) or isinstance(attempts, bool) or not 1 <= attempts <= 1000:
        r.error(r.where.line("max_attempts"), "max_attempts: expected an integer from 1 to 1000")
        attempts = DEFAULT_MAX_ATTEMPTS
    retry_for = DEFAULT_RETRY_FOR
    if "retry_for" in raw:
        retry_for = r.duration(raw["retry_for"], r.where.line("retry_for"), "retry_for",
                               retry_for)
    sinks = _sinks(r, raw.get("sinks", {}))
    declared = list(raw["sinks"]) if isinstance(raw.get("sinks"), dict) else []
    rules = _rules(r, raw.get("rules", []), declared)  # a sink with errors is said once
    used = {rule.sink for rule in rules}
    for sink in sinks:
        if sink.name not in used:
            r.warn(r.where.line("sinks", sink.name), f"sink '{sink.name}': no rule sends to it")
    if not rules and "rules" not in raw and sinks:
        r.warn(1, "no [[rules]]: nothing is ever sent")
    return NotifyConfig(
        path=r.path, sinks=tuple(sinks), rules=tuple(rules), heartbeat_url=heartbeat_url,
        heartbeat_url_env=heartbeat_env, heartbeat_interval=interval, max_attempts=attempts,
        retry_for=retry_for, backoff=_backoff(r, raw.get("backoff")),
    )


def _backoff(r: _Reader, raw: Any) -> tuple[float, float, float]:
    base, factor, cap = DEFAULT_BACKOFF
    if raw is None:
        return DEFAULT_BACKOFF
    line = r.where.line("backoff")
    if not isinstance(raw, dict):
        r.error(line, "backoff: expected a table like { base = \"10s\", factor = 2, max = \"5m\" }")
        return DEFAULT_BACKOFF
    for key in raw:
        if key not in BACKOFF_KEYS:
            r.unknown(line, "backoff: ", key, BACKOFF_KEYS)
    if "base" in raw:
        base = r.duration(raw["base"], line, "backoff.base", base)
    if "max" in raw:
        cap = r.duration(raw["max"], line, "backoff.max", cap)
    if "factor" in raw:
        value = raw["factor"]
        if (not isinstance(value, int | float) or isinstance(value, bool)
                or not 1 <= value <= 10):
            r.error(line, "backoff.factor: expected a number from 1 to 10")
        else:
            factor = float(value)
    return base, factor, cap


def _http_url(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.netloc)


def _env_name(r: _Reader, value: Any, line: int, what: str) -> bool:
    if not isinstance(value, str) or not ENV_RE.fullmatch(value):
        r.error(line, f"{what}: expected the name of an environment variable, e.g. "
                "\"CRONKEEPER_SLACK_URL\" (the secret itself never goes in this file)")
        return False
    return True


def _sinks(r: _Reader, raw: Any) -> list[Sink]:
    if not isinstance(raw, dict):
        r.error(r.where.line("sinks"), "sinks: expected tables like [sinks.NAME]")
        return []
    found = []
    kinds = tuple(k.value for k in SinkKind)
    for name, settings in raw.items():
        line = r.where.line("sinks", name)
        if not isinstance(settings, dict):
            r.error(line, f"sink '{name}': expected a table [sinks.{name}]")
            continue
        if not NAME_RE.fullmatch(name):
            r.error(line, f"sink '{name}': names are [a-z0-9][a-z0-9._-]*")
        kind = settings.get("kind")
        if kind is None:
            r.error(line, f"sink '{name}': missing key 'kind' (one of: {', '.join(kinds)})")
            continue
        if kind not in kinds:
            r.unknown(r.where.line("sinks", name, "kind"), f"sink '{name}': ", str(kind), kinds,
                      what="kind")
            continue
        sink_kind = SinkKind(kind)
        ok = _check_sink(r, name, sink_kind, settings)
        timeout = DEFAULT_TIMEOUT[sink_kind]
        if "timeout" in settings:
            timeout = r.duration(settings["timeout"], r.where.line("sinks", name, "timeout"),
                                 f"sink '{name}': timeout", timeout)
        if ok:
            found.append(Sink(name, sink_kind, tuple((k, v) for k, v in settings.items()
                                                     if k not in ("kind", "timeout")), timeout))
    return found


def _check_sink(r: _Reader, name: str, kind: SinkKind, s: dict[str, Any]) -> bool:
    """Report every problem of one sink; True when it has none."""
    before = len(r.found)

    def at(key: str) -> int:
        return r.where.line("sinks", name, key)

    where = f"sink '{name}': "
    for key in s:
        if key not in SINK_KEYS[kind]:
            if key == "url" and kind in (SinkKind.SLACK, SinkKind.APPRISE):
                r.error(at(key), f"{where}a {kind} URL holds the service's secret: give the name "
                        "of the environment variable that holds it (url_env), never the URL")
            elif key in ("password", "user", "secret"):
                r.error(at(key), f"{where}secrets go by environment variable name: "
                        f"{key}_env = \"NAME\"")
            else:
                r.unknown(at(key), where, key, SINK_KEYS[kind])
    for key in SINK_KEYS[kind]:
        if key.endswith("_env") and key in s:
            _env_name(r, s[key], at(key), f"{where}{key}")
    if kind in (SinkKind.SLACK, SinkKind.APPRISE) and "url_env" not in s:
        r.error(r.where.line("sinks", name), f"{where}missing key 'url_env' (the environment "
                f"variable that holds the {kind} URL)")
    if kind is SinkKind.WEBHOOK:
        if ("url" in s) == ("url_env" in s):
            r.error(r.where.line("sinks", name), f"{where}give url or url_env (one of them)")
        elif "url" in s and not _http_url(s["url"]):
            r.error(at("url"), f"{where}url: expected an http:// or https:// URL")
    if kind is SinkKind.EMAIL:
        _check_email(r, name, s, at)
    return not any(d.severity is Severity.ERROR for d in r.found[before:])


def _check_email(r: _Reader, name: str, s: dict[str, Any], at: Any) -> None:
    where = f"sink '{name}': "
    smtp = s.get("smtp")
    if smtp is None:
        r.error(r.where.line("sinks", name), f"{where}missing key 'smtp' (e.g. "
                "\"smtp://127.0.0.1:25\", or \"smtps://mail.example.com:465\")")
    elif not isinstance(smtp, str) or urlsplit(smtp).scheme not in ("smtp", "smtps") \
            or not urlsplit(smtp).hostname or urlsplit(smtp).username:
        r.error(at("smtp"), f"{where}smtp: expected smtp://HOST[:PORT] (STARTTLS when the server "
                "offers it) or smtps://HOST[:PORT], without a user or password (user_env, "
                "password_env)")
    sender = s.get("from")
    if sender is None:
        r.error(r.where.line("sinks", name), f"{where}missing key 'from' (the sender's address)")
    elif not isinstance(sender, str) or not is_address(sender):
        r.error(at("from"), f"{where}from: expected an e-mail address")
    to = s.get("to")
    if to is not None and (not isinstance(to, list) or not to
                           or not all(isinstance(a, str) and is_address(a) for a in to)):
        r.error(at("to"), f"{where}to: expected a non-empty list of e-mail addresses")
    to_owner = s.get("to_owner", False)
    if not isinstance(to_owner, bool):
        r.error(at("to_owner"), f"{where}to_owner: expected true or false")
    if to is None and to_owner is not True:
        r.error(r.where.line("sinks", name), f"{where}give 'to' (a list of addresses) and/or "
                "to_owner = true (the schedule's owner, when it is an address)")
    if ("user_env" in s) != ("password_env" in s):
        r.error(r.where.line("sinks", name), f"{where}user_env and password_env go together")
    if "ca_file" in s and not isinstance(s["ca_file"], str):
        r.error(at("ca_file"), f"{where}ca_file: expected the path of a PEM file")


def _rules(r: _Reader, raw: Any, sinks: list[str]) -> list[Rule]:
    if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
        r.error(r.where.line("rules"), "rules: expected [[rules]] tables")
        return []
    found = []
    events_known = tuple(e.value for e in Event)
    for pos, rule in enumerate(raw):
        line = r.where.entry_line(pos)
        for key in rule:
            if key not in RULE_KEYS:
                r.unknown(r.where.entry_line(pos, key), f"rule {pos + 1}: ", key, RULE_KEYS)
        events = frozenset(Event)
        if "events" in rule:
            value = rule["events"]
            if not isinstance(value, list) or not value:
                r.error(r.where.entry_line(pos, "events"), f"rule {pos + 1}: events: expected a "
                        f"non-empty list of: {', '.join(events_known)}")
            else:
                for event in value:
                    if event not in events_known:
                        r.unknown(r.where.entry_line(pos, "events"), f"rule {pos + 1}: ",
                                  str(event), events_known, what="event")
                events = frozenset(Event(e) for e in value if e in events_known)
        owners, schedules, tasks = (r.globs(pos, rule, k, "rule", "team-*")
                                    for k in ("owners", "schedules", "tasks"))
        sink = rule.get("sink")
        if sink is None:
            r.error(line, f"rule {pos + 1}: missing key 'sink'")
            continue
        if sink not in sinks:
            close = difflib.get_close_matches(str(sink), sinks, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            r.error(r.where.entry_line(pos, "sink"), f"rule {pos + 1}: no sink named "
                    f"'{sink}'{hint}")
            continue
        found.append(Rule(pos, events, owners, schedules, tasks, sink))
    return found


def environment_problems(config: NotifyConfig, environ: Mapping[str, str]) -> list[str]:
    """What this process's environment lacks for the config: each variable a sink or the
    heartbeat names that is unset or empty, and each value that is not what it should be."""
    problems = []
    for sink in config.sinks:
        for name in sink.env_names():
            if not environ.get(name):
                problems.append(f"sink '{sink.name}': environment variable {name} is not set")
        url_env = sink.get("url_env")
        if url_env and environ.get(url_env) and sink.kind in (SinkKind.SLACK, SinkKind.WEBHOOK) \
                and not _http_url(environ[url_env]):
            problems.append(f"sink '{sink.name}': {url_env} is not an http:// or https:// URL")
    env = config.heartbeat_url_env
    if env is not None:
        if not environ.get(env):
            problems.append(f"heartbeat_url_env: environment variable {env} is not set")
        elif not _http_url(environ[env]):
            problems.append(f"heartbeat_url_env: {env} is not an http:// or https:// URL")
    return problems


def heartbeat_url(config: NotifyConfig, environ: Mapping[str, str]) -> str | None:
    if config.heartbeat_url_env is not None:
        return environ.get(config.heartbeat_url_env) or None
    return config.heartbeat_url
