"""What every request handler shares: the server's Context (database, schema, settings, caches)
and the login redirect. A module of its own so that routes and actions depend on it, not on the
app that registers them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import g, redirect
from werkzeug.wrappers import Response as WerkzeugResponse

from cronkeeper.web import security
from cronkeeper.web.pages import VersionsCache
from cronkeeper.web.security import WebConfig


@dataclass
class Context:
    """What every request handler needs: the database, where, and how to behave."""

    engine: Any
    schema: str
    cluster: str
    database: str  # the URL with its password hidden, as status shows it
    config: WebConfig
    cache: VersionsCache


def ctx() -> Context:
    from flask import current_app

    return current_app.extensions["cronkeeper"]


def login_redirect(target: str) -> WerkzeugResponse:
    """Exchange a good token for the session cookie, and go where the user was going."""
    g.login_sid = g.sid
    return redirect(security.local_path(target), code=303)
