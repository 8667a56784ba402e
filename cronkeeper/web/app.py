"""The WSGI application behind ``cronkeeper web``: Flask for routing and Jinja2 templates
(autoescaped), served by waitress (threads: sync SQLAlchemy, our one concurrency model).

This module holds the request gate (host allowlist, authentication, the POST rules; see
``web.security``) and error pages; ``web.routes`` the pages and JSON mirrors;
``web.actions`` the POSTs that exist only with ``--allow-actions``."""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any
from urllib.parse import urlencode

from flask import Flask, Response, g, jsonify, render_template, request
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as WerkzeugResponse

from cronkeeper import __version__, clock
from cronkeeper.errors import CronkeeperError, DatabaseError
from cronkeeper.operations.leadership import leaderless
from cronkeeper.outage import Repeats
from cronkeeper.output import escape_text
from cronkeeper.web import security
from cronkeeper.web.context import Context, login_redirect
from cronkeeper.web.security import AUTH_COOKIE, SESSION_COOKIE, WebConfig

log = logging.getLogger("cronkeeper.web")
OPEN_PATHS = ("/login", "/static/")


def create_app(context: Context) -> Flask:
    app = Flask(__name__)
    app.extensions["cronkeeper"] = context
    app.jinja_env.globals.update(version=__version__, cluster=context.cluster)
    app.jinja_env.autoescape = True  # every template, whatever its name ends with
    # Text a job wrote (errors, output tails): control characters shown as \xNN, then escaped.
    app.jinja_env.filters["controls"] = escape_text

    @app.before_request
    def gate() -> WerkzeugResponse | None:
        config = context.config
        if not security.host_allowed(request.host, config):
            return _error(400, "this server does not answer to the host name "
                          f"{request.host!r} (start it with --allowed-host NAME to allow it)")
        g.sid = request.cookies.get(SESSION_COOKIE) or ""
        g.new_sid = None
        if len(g.sid) != 32:
            g.sid = g.new_sid = secrets.token_hex(16)
        g.csrf = config.csrf_token(g.sid)
        g.actions = config.allow_actions
        g.authed = _authenticated(config)
        if request.method == "POST":
            return _check_post(config) or _refuse_nul()
        given = request.args.get("token")
        if config.token and given is not None and security.same_token(given, config.token):
            return login_redirect(_without_token())
        if config.token and not g.authed:
            if request.path.startswith(OPEN_PATHS) and given is None:
                return None
            if given is not None or request.path.startswith("/api/") or _bearer():
                return _error(401, "a valid token is needed", bearer=True)
            resp = Response(render_template("login.html", next=request.full_path.rstrip("?"),
                                            failed=False), 401)
            return resp
        return _refuse_nul()

    @app.context_processor
    def leader_banner() -> dict[str, Any]:
        """Every page says so when nothing leads, and what becomes of the periods meanwhile
        (not to a request that is refused or not signed in: it learns nothing of the cluster)."""
        if not getattr(g, "authed", False):
            return {"no_leader": False}
        try:
            missing, last = leaderless(context.engine, context.cluster)
        except DatabaseError:  # the page itself says the database is away
            return {"no_leader": False}
        return {"no_leader": missing, "banner_last_leader": last}

    @app.after_request
    def cookies(resp: Response) -> Response:
        if getattr(g, "new_sid", None):
            resp.set_cookie(SESSION_COOKIE, g.new_sid, httponly=True, samesite="Strict",
                            path="/")
        login = getattr(g, "login_sid", None)
        if login:
            resp.set_cookie(AUTH_COOKIE, context.config.auth_cookie(login), httponly=True,
                            samesite="Strict", path="/")
        return resp

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        return _error(exc.code or 500, exc.description or exc.name)

    @app.errorhandler(DatabaseError)
    def database_error(exc: DatabaseError):
        return _error(503, f"the database could not answer: {exc}")

    @app.errorhandler(CronkeeperError)
    def cronkeeper_error(exc: CronkeeperError):
        return _error(400, str(exc))

    crashes = Crashes()

    @app.errorhandler(Exception)
    def crash(exc: Exception):
        crashes.say(exc)
        return _error(500, f"internal error ({type(exc).__name__}); see the server's log")

    from cronkeeper.web import actions, routes

    routes.register(app)
    actions.register(app)
    return app


class Crashes:
    """A page's internal error (a bug), said at ERROR with its traceback the first time, then
    once a minute while the same error recurs on the same page, with how many (SPEC §10: not a
    flood): a dashboard refreshing a broken page every few seconds in several tabs wrote a
    traceback per request. The same error: the page's endpoint, the exception's type and the
    line that raised it (``outage.Repeats``)."""

    def __init__(self) -> None:
        self._repeats = Repeats()
        self._lock = threading.Lock()  # the server's threads share it

    def say(self, exc: Exception) -> None:
        with self._lock:
            notice = self._repeats.failed(request.endpoint or "?", exc, clock.monotonic())
        if notice is not None:
            log.error("web: internal error on %s %s: %s: %s (this is a bug in cronkeeper; said "
                      "once a minute while it repeats: %d times in %.0fs)", request.method,
                      request.path, type(exc).__name__, exc, notice.failures, notice.lasted,
                      exc_info=exc if notice.first else None, extra={"action": "web_error"})


def wsgi(context: Context):
    """The application with the security headers on every response."""
    app = create_app(context)
    app.wsgi_app = security.SecurityHeaders(app.wsgi_app)  # type: ignore[method-assign]
    return app


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _authenticated(config: WebConfig) -> bool:
    if not config.token:
        return True
    bearer = _bearer()
    if bearer is not None:
        return security.same_token(bearer, config.token)
    cookie = request.cookies.get(AUTH_COOKIE)
    return bool(cookie and not g.new_sid
                and security.same_token(cookie, config.auth_cookie(g.sid)))


def _check_post(config: WebConfig) -> Response | None:
    if request.path not in ("/login", "/logout") and not config.allow_actions:
        return _error(403, "read-only: this server was started without --allow-actions")
    if security.cross_site(request.headers.get("Sec-Fetch-Site")):
        return _error(403, "refused: the request comes from another site")
    if g.new_sid or not security.same_token(request.form.get("csrf"), g.csrf):
        return _error(403, "refused: the form's CSRF token is missing or stale; reload the page "
                      "and try again")
    if request.path in ("/login", "/logout"):
        return None
    if config.token and not g.authed:
        return _error(401, "a valid token is needed", bearer=True)
    return None


def _refuse_nul() -> Response | None:
    """PostgreSQL text cannot hold NUL, so the driver refuses a key, name or filter holding
    one before the database sees it: say what is wrong (400), not that the database is away."""
    values = [request.path, *(v for _, v in request.args.items(multi=True))]
    if request.method == "POST":
        values += [v for _, v in request.form.items(multi=True)]
    if any("\x00" in v for v in values):
        return _error(400, "a NUL character (%00) is in the address or the form: no key, name "
                      "or filter holds one")
    return None


def _without_token() -> str:
    args = [(k, v) for k, v in request.args.items(multi=True) if k != "token"]
    return request.path + (f"?{urlencode(args)}" if args else "")


def _error(code: int, message: str, *, bearer: bool = False) -> Response:
    wants_json = request.path.startswith("/api/")
    if wants_json:
        resp = jsonify({"error": message, "status": code})
        resp.status_code = code
    else:
        resp = Response(render_template("error.html", code=code, message=message), code)
    if bearer:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="cronkeeper"'
    return resp
