"""cronkeeper web: the read-only view of the cluster, in a browser (docs/web.md)."""

from __future__ import annotations

import gc
import logging
import os

import click

from cronkeeper import logs
from cronkeeper.cli.common import database_options
from cronkeeper.errors import CronkeeperError

log = logging.getLogger("cronkeeper.web")

# The pooled connections one request thread can hold at once: its own, and, for a status read
# (``/api/status``, ``/instances``: ``operations.status.gather``), two more taken by its reads
# aside while it holds its own. With the former pool (5, and 5 more for a moment), ten threads
# reading status at once held all ten connections for their own reads, and their reads aside
# waited for one until the pool's 30 s timeout, and then answered 503.
REQUEST_CONNECTIONS = 3
# The longest a page's statement may run, a wait for a lock included: past it the page says the
# database could not answer (503) and frees its thread. Without it, a read behind a lock held for
# minutes (a migration's DDL) held its thread as long, and --threads such reads hung every page.
# Warm, the slowest page's statements take about a second at 10,000 schedules (docs/web.md).
STATEMENT_SECONDS = 30


@click.command("web")
@database_options
@click.option("--address", envvar="CRONKEEPER_WEB_ADDRESS", default="127.0.0.1:9480",
              show_default=True, help="HOST:PORT to listen on (env CRONKEEPER_WEB_ADDRESS). A "
              "non-loopback address needs a token.")
@click.option("--allow-actions", is_flag=True,
              help="Allow pause, resume, trigger, and replay or discard of dead letters.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="File holding the access token (else env CRONKEEPER_WEB_TOKEN).")
@click.option("--allowed-host", "allowed_hosts", multiple=True,
              help="Another host name the server answers to (repeatable), e.g. the name a "
              "reverse proxy forwards.")
@click.option("--periods", type=click.IntRange(1, 500), default=48, show_default=True,
              help="How many periods each strip shows.")
@click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Requests served at once.")
def web_command(database_url, schema, cluster, address, allow_actions, token_file,
                allowed_hosts, periods, threads) -> None:
    """Serve the schedules, their period strips, instances, queue and dead letters."""
    from cronkeeper.web.security import WebConfig, check_bind, parse_address, read_token

    logs.configure("text", "info")
    host, port = parse_address(address)
    token = read_token(os.environ.get("CRONKEEPER_WEB_TOKEN"), token_file)
    check_bind(host, token)
    try:
        import waitress

        from cronkeeper.web.app import Context, wsgi
        from cronkeeper.web.pages import VersionsCache
    except ImportError as exc:
        raise CronkeeperError(
            f"cronkeeper web needs its extra ({exc.name} is missing): "
            "pip install 'cronkeeper[web]'") from None
    from cronkeeper.cli.connect import open_database
    from cronkeeper.db.engine import limit_statements, redact

    db = open_database(database_url, schema, application_name="cronkeeper-web",
                       pool_size=threads * REQUEST_CONNECTIONS)
    config = WebConfig.make(host, port, token, allow_actions, allowed_hosts, periods)
    cache = VersionsCache()
    cache.warm(db.engine, periods)  # parse versions, compute fires, before the first visitor
    # What warming built stays for the process's life (10,000 specs, triggers, fires): exempt
    # it from the collector's full passes, each of which walked it all again (0.1 s of a
    # state filter's request at 10,000 schedules). Objects are still freed by reference count.
    gc.collect()
    gc.freeze()
    limit_statements(db.engine, STATEMENT_SECONDS)
    app = wsgi(Context(db.engine, schema, cluster, redact(db.url), config, cache))
    try:
        server = waitress.create_server(app, host=host, port=port, threads=threads,
                                        ident="cronkeeper")
    except OSError as exc:
        raise CronkeeperError(f"cannot listen on {address}: {exc.strerror or exc}") from None
    bound = server.effective_port
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"cronkeeper web listening on http://{shown}:{bound}/ "
               f"({'actions allowed' if allow_actions else 'read-only'}"
               f"{', token required' if token else ''}); Ctrl-C stops it", err=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        db.engine.dispose()
