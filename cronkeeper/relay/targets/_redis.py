"""What the three Redis-backed targets (RQ, Sidekiq, BullMQ) share: checking a target's
settings and a route's options, one Redis client per target, and Redis failures translated into
the seam's errors (every Redis failure is retryable: the same id is published again)."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from cronkeeper import clock
from cronkeeper.errors import CronkeeperError
from cronkeeper.relay.targets.base import Delivery, PublishError

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


class TargetConfigError(CronkeeperError):
    """A target's settings or a route's options are wrong: the relay refuses to start."""

    exit_code = 2


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          dict: "a table", list: "a list"}


def check_keys(where: str, given: Mapping[str, Any], known: frozenset[str]) -> None:
    """Every unknown key at once, each with a did-you-mean where one is close."""
    problems = []
    for key in sorted(set(given) - known):
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        problems.append(f"{where}: unknown setting '{key}'{hint}")
    if problems:
        raise TargetConfigError("; ".join(problems))


def setting(where: str, settings: Mapping[str, Any], key: str, kind: type | tuple[type, ...],
            default: Any) -> Any:
    value = settings.get(key, default)
    if value is default:
        return value
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise TargetConfigError(f"{where}: '{key}' must be a number, not {value!r}")
    if not isinstance(value, kind):
        kinds = kind if isinstance(kind, tuple) else (kind,)
        names = " or ".join(_NAMES.get(k, k.__name__) for k in kinds)
        raise TargetConfigError(f"{where}: '{key}' must be {names}, not {value!r}")
    return value


def route_options(target: str, delivery: Delivery, known: frozenset[str]) -> dict[str, Any]:
    options = dict(delivery.options)
    check_keys(f"target '{target}' route options", options, known)
    return options


def redis_client(url: str, timeout: float):
    """A synchronous redis-py client; connection and socket timeouts so a dead Redis fails a
    publish instead of hanging the relay past its lease."""
    import redis

    return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)


@contextmanager
def publishing(target: str, what: str) -> Iterator[None]:
    """Redis errors become PublishError (retryable: the target id is deterministic, so the
    retry cannot make a second job where the first one landed)."""
    import redis

    try:
        yield
    except redis.RedisError as exc:
        raise PublishError(f"target '{target}': {what} failed: {type(exc).__name__}: {exc}") from exc


def delay_seconds(run_after: datetime) -> float:
    """How far ``run_after`` lies in the future by the wall clock (0 when due)."""
    return max(0.0, (run_after - clock.wall()).total_seconds())


def redacted(url: str) -> str:
    """A Redis URL without its password, for messages."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***' if ':' in creds else user}@{host}"
