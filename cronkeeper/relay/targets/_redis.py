"""What the three Redis-backed targets (RQ, Sidekiq, BullMQ) share: their settings checked by
small rules (``check`` for ``cronkeeper validate --relay-config``, again in ``build``), route
options checked at publish, one Redis client per target, and Redis failures translated into the
seam's errors: an unreachable Redis, or one that does not answer within ``socket_timeout``, is
``TargetUnavailable`` (the relay rests the target and hands the batch back uncounted), any other
Redis failure a retryable ``PublishError``. The target id is
deterministic, so a retry cannot make a second job where the first one landed.

Imports no queue library at module import: validation stays light."""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from cronkeeper import clock
from cronkeeper.errors import CronkeeperError
from cronkeeper.relay.targets.base import Delivery, PublishError, RelayJob, TargetUnavailable

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
log = logging.getLogger("cronkeeper.relay")

Rule = Callable[[Any], str | None]  # a message when the value is wrong, else None


class TargetConfigError(CronkeeperError):
    """A target's settings are wrong: the relay refuses to start."""

    exit_code = 2


# -- rules ----------------------------------------------------------------------------------


def text(value: Any) -> str | None:
    return None if isinstance(value, str) and value else "must be a non-empty string"


def redis_url(value: Any) -> str | None:
    if not isinstance(value, str) or not value.startswith(("redis://", "rediss://", "unix://")):
        return "must be a redis://, rediss:// or unix:// URL"
    return None


def integer(low: int) -> Rule:
    def rule(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            return f"must be a whole number >= {low}"
        return None
    return rule


def seconds(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return "must be a number of seconds > 0"
    return None


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def one_of(*allowed: str) -> Rule:
    def rule(value: Any) -> str | None:
        return None if value in allowed else "must be " + " or ".join(f'"{a}"' for a in allowed)
    return rule


def table(value: Any) -> str | None:
    return None if isinstance(value, dict) else "must be a table, e.g. { type = \"fixed\", delay = 1000 }"


def check_settings(given: Mapping[str, Any], rules: Mapping[str, Rule]) -> list[tuple[str, str]]:
    """Every problem at once, as (key, message); unknown keys with a did-you-mean."""
    problems: list[tuple[str, str]] = []
    known = sorted({"kind", *rules})
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(known)})"
            problems.append((key, f"unknown setting '{key}'{hint}"))
    for key, rule in rules.items():
        if key in given and (message := rule(given[key])) is not None:
            problems.append((key, f"'{key}' {message}, not {given[key]!r}"))
    return problems


def require_valid(name: str, problems: list[tuple[str, str]]) -> None:
    if problems:
        raise TargetConfigError("; ".join(f"target '{name}': {m}" for _, m in problems))


def route_options(target: str, delivery: Delivery, rules: Mapping[str, Rule]) -> dict[str, Any]:
    """A route's options, checked. A wrong one fails the publish (retryable: fixing the relay
    config and restarting the relay lets the job through)."""
    if not delivery.options:
        return {}
    options = dict(delivery.options)
    problems = check_settings({"kind": None, **options}, rules)
    if problems:
        raise PublishError(f"target '{target}': route options: " + "; ".join(m for _, m in problems))
    return options


# -- Redis ----------------------------------------------------------------------------------


def redis_client(url: str, timeout: float):
    """A synchronous redis-py client; connection and socket timeouts so a dead Redis fails a
    publish instead of hanging the relay past its lease."""
    import redis

    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


@contextmanager
def publishing(target: str, what: str) -> Iterator[None]:
    import redis

    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        # No answer within socket_timeout (a hung or partitioned Redis) is the target's state,
        # not the job's: counting it as an attempt dead-lettered every job in flight while
        # Redis was merely stuck. What may have landed is republished under the same id.
        raise TargetUnavailable(f"target '{target}': {what}: Redis unreachable: {exc}") from exc
    except redis.RedisError as exc:
        raise PublishError(f"target '{target}': {what} failed: {type(exc).__name__}: {exc}") from exc


def unknown_on_failure(target: str, ids: list[str], ask: Callable[[], list[Any]]) -> list[Any]:
    """Run a status query; when Redis fails, every answer is UNKNOWN (logged): a poll that
    cannot reach the target must not stop the relay, and the timeout bound still applies."""
    from cronkeeper.relay.targets.base import Completion

    try:
        return ask()
    except PublishError as exc:
        log.warning("status unknown: target=%s jobs=%d error=%s", target, len(ids), exc,
                    extra={"action": "status_unknown", "target": target})
        return [Completion.UNKNOWN] * len(ids)


def delay_seconds(job: RelayJob) -> float:
    """How long ``job`` is still to wait (0 when due): by the database's clock when the relay
    reckoned it (``due_in``), so that a host clock an hour behind holds no due job back an
    hour; else by this host's wall clock."""
    if job.due_in is not None:
        return max(0.0, job.due_in)
    return max(0.0, (job.run_after - clock.wall()).total_seconds())


def redacted(url: str) -> str:
    """A Redis URL without its password, for messages."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***' if ':' in creds else user}@{host}"
