"""``--notify-config`` and ``--web-url`` of ``cronkeeper run`` and ``cronkeeper worker``
(docs/notifications.md): the config read and checked at start (every problem at once, and each
environment variable it names that this process lacks), then the sender started beside the
process's own work."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import click

from cronkeeper.cli.common import config_or_exit
from cronkeeper.errors import UsageError
from cronkeeper.schedule.diagnostics import safe

log = logging.getLogger("cronkeeper.notify")


def notify_options(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option(
        "--web-url", "web_url", envvar="CRONKEEPER_WEB_URL", default=None, metavar="URL",
        help="Where `cronkeeper web` is reached (env CRONKEEPER_WEB_URL): notifications link "
             "to its explain and schedule pages.")(func)
    return click.option(
        "--notify-config", "notify_config", envvar="CRONKEEPER_NOTIFY_CONFIG", default=None,
        type=click.Path(dir_okay=False), metavar="FILE",
        help="Sinks and rules: who is told about dead letters, missed and missing periods and "
             "recoveries (env CRONKEEPER_NOTIFY_CONFIG; docs/notifications.md).")(func)


def load(path: str | None, web_url: str | None = None):  # noqa: ANN201 - NotifyConfig | None
    """The notify config at ``path`` (None: none given), or a UsageError that lists every
    problem, and every environment variable it names that this process lacks."""
    if web_url is not None and not web_url.startswith(("http://", "https://")):
        raise UsageError(f"--web-url {safe(web_url)!r}: expected an http:// or https:// URL")
    if path is None:
        return None
    from cronkeeper.notify.config import environment_problems, load_notify_config

    config = config_or_exit(load_notify_config(path), "notify", log)
    missing = environment_problems(config, os.environ)
    if missing:
        raise UsageError(f"notify config {safe(path)}: " + "; ".join(missing))
    return config


def start_sender(engine: Any, config: Any, *, schema: str, sender_id: str,
                 web_url: str | None) -> Any:
    """Start the notification sender (None without a config), on connections of its own: a
    slow sink never holds one the process's own work needs."""
    if config is None:
        return None
    from cronkeeper.db.engine import make_engine
    from cronkeeper.notify.sender import Sender

    own = make_engine(engine.url, schema, pool_size=2, application_name="cronkeeper-notify")
    sender = Sender(own, config, schema=schema, sender_id=sender_id, web_url=web_url)
    sender.start()
    return sender


def pinger(config: Any, instance: str) -> Any:
    """The heartbeat_url pinger the leader beats (None without a heartbeat URL)."""
    if config is None:
        return None
    from cronkeeper.notify.config import heartbeat_url
    from cronkeeper.notify.heartbeat import Pinger

    url = heartbeat_url(config, os.environ)
    if url is None:
        return None
    found = Pinger(url, config.heartbeat_interval, instance=instance)
    found.start()
    return found
