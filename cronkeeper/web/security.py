"""The web's security model (docs/web.md), in one place:

- **Where it listens.** 127.0.0.1 by default; any other address needs a token, or it refuses
  to start (``check_bind``).
- **Who may read.** With a token configured, every request but ``/login`` and the stylesheet
  must carry it: ``Authorization: Bearer TOKEN`` (scripts), or the session cookie a browser
  gets in exchange for it at ``/login`` (or a ``?token=`` link, which is answered with the
  cookie and a redirect to the same page without the token, so it leaves the address bar and
  the history). Cookies are ``HttpOnly; SameSite=Strict``. Missing or wrong: 401.
- **Who may act.** Only with ``--allow-actions``; otherwise every POST answers 403 before
  anything else is looked at. Every POST (login included) needs the CSRF token of its session
  (an HMAC of the session id) and is refused when the browser says it comes from another site
  (``Sec-Fetch-Site``).
- **Which names it answers to.** The ``Host`` header must name the bound address,
  ``localhost`` or a name given with ``--allowed-host`` (DNS rebinding): otherwise 400.
- **Headers on every response**, errors included, added by a WSGI middleware around the whole
  application: a Content-Security-Policy that allows no script at all, ``nosniff``,
  ``Referrer-Policy: no-referrer``, no framing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cronkeeper.errors import UsageError

CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'")
HEADERS = [
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
]
SESSION_COOKIE = "ck_sid"
AUTH_COOKIE = "ck_auth"


@dataclass(frozen=True, slots=True)
class WebConfig:
    host: str
    port: int
    token: str | None = None
    allow_actions: bool = False
    allowed_hosts: frozenset[str] = field(default_factory=frozenset)
    periods: int = 48
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @classmethod
    def make(cls, host: str, port: int, token: str | None, allow_actions: bool,
             allowed_hosts: Iterable[str] = (), periods: int = 48) -> WebConfig:
        # With a token the signing key follows it: sessions survive a restart, and changing
        # the token signs everyone out.
        secret = (hashlib.sha256(b"cronkeeper-web:" + token.encode()).digest() if token
                  else secrets.token_bytes(32))
        names = {host.lower().strip("[]"), "localhost", *(h.lower() for h in allowed_hosts)}
        return cls(host, port, token, allow_actions, frozenset(names), periods, secret)

    def sign(self, purpose: str, value: str) -> str:
        return hmac.new(self.secret, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def csrf_token(self, sid: str) -> str:
        return self.sign("csrf", sid)

    def auth_cookie(self, sid: str) -> str:
        return self.sign("auth", sid)


def is_loopback(host: str) -> bool:
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def parse_address(value: str) -> tuple[str, int]:
    host, sep, port = value.strip().rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise UsageError(f"--address {value!r}: expected HOST:PORT, e.g. 127.0.0.1:9480")
    return host.strip("[]"), int(port)


def check_bind(host: str, token: str | None) -> None:
    if token is None and not is_loopback(host):
        raise UsageError(
            f"refusing to listen on {host}: a non-loopback address needs a token, so that only "
            "people who have it can read the cluster (set CRONKEEPER_WEB_TOKEN or --token-file)"
        )


def read_token(env_value: str | None, token_file: str | None) -> str | None:
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise UsageError(f"--token-file {token_file}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--token-file {token_file} is not UTF-8 text") from None
        if not token:
            raise UsageError(f"--token-file {token_file} is empty")
        return token
    token = (env_value or "").strip()
    if env_value is not None and not token:
        raise UsageError("CRONKEEPER_WEB_TOKEN is set but empty")
    return token or None


def host_allowed(host_header: str | None, config: WebConfig) -> bool:
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):
        name = host[1:host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return name in config.allowed_hosts


def same_token(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def local_path(target: str | None) -> str:
    """Where to send a browser after login: a path on this server, else ``/``. Refuses
    ``//host`` and ``/\\host`` (browsers read both as another host) and control characters."""
    if (not target or not target.startswith("/") or target[1:2] in ("/", "\\")
            or any(ord(ch) < 0x20 or ch == "\\" for ch in target)):
        return "/"
    return target


def cross_site(sec_fetch_site: str | None) -> bool:
    """True when the browser says the request comes from another origin. Browsers send
    ``same-origin`` (or ``none`` for a typed address); scripts send nothing."""
    return sec_fetch_site is not None and sec_fetch_site.lower() not in ("same-origin", "none")


class SecurityHeaders:
    """WSGI middleware: the security headers on every response the application gives,
    whatever produced it (a page, an error handler, a crash turned into a 500)."""

    def __init__(self, app: Callable) -> None:
        self.app = app

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        names = {name.lower() for name, _ in HEADERS}

        def with_headers(status: str, headers: list[tuple[str, str]], exc_info=None):
            kept = [(k, v) for k, v in headers if k.lower() not in names]
            return start_response(status, kept + HEADERS, exc_info)

        return self.app(environ, with_headers)
