"""A sink's ``timeout`` bounds its whole request: connecting, the TLS handshake, sending, and
reading the answer (for e-mail, the whole SMTP conversation), not each socket operation.

A socket timeout alone bounds each read: a server that answers a byte at a time, each within
the timeout, kept a request going for as long as it liked, past the sender's lease on the
notification (another sender then took it over and told the sinks again) and past the
heartbeat's interval. So each socket a request opens is watched (``Deadline.watch``): a timer
shuts the watched sockets down when the time is up, which ends any read or write in progress
at once, and the request fails with ``Deadline.passed`` (retried, as any timeout).

A name lookup (``getaddrinfo``) cannot be interrupted: it is bounded by the resolver's own
timeouts. Only the standard library (``http.client`` and ``smtplib`` through their hooks).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import urllib.request
from types import TracebackType
from typing import Any

from cronkeeper import clock


class Deadline:
    """``with Deadline(timeout) as deadline:`` everything the request does; ``expired`` is
    true once the time ran out and the watched sockets were shut down."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.ends = clock.monotonic() + timeout
        self.expired = False
        self._done = False
        self._lock = threading.Lock()
        self._watched: list[socket.socket] = []
        self._timer = threading.Timer(timeout, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> Deadline:
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:  # no socket is shut down once the request let go of it
            self._done = True
        self._timer.cancel()

    def remaining(self) -> float:
        """The time left, as a socket timeout (never 0: that would make the socket
        non-blocking; a request started past its deadline is cut at once by ``watch``)."""
        return max(0.05, self.ends - clock.monotonic())

    def watch(self, sock: socket.socket) -> None:
        """Shut ``sock`` down when the time is up (at once if it already is)."""
        with self._lock:
            self._watched.append(sock)
            if self.expired:
                _cut(sock)

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            for sock in self._watched:
                _cut(sock)

    def passed(self, what: str) -> str:
        return (f"{what}: the whole request passed its timeout of {self.timeout:g}s "
                "(connect, send and answer together; the answer came too slowly or not at all)")

    # -- the hooks ------------------------------------------------------------------------------
    def context(self, context: ssl.SSLContext) -> Any:
        """``context`` whose TLS sockets are watched before their handshake."""
        return _WatchedContext(context, self)

    def opener(self, context: ssl.SSLContext) -> urllib.request.OpenerDirector:
        """A urllib opener (proxies, redirects, errors as ``urlopen``) whose connections'
        sockets are watched."""
        return urllib.request.build_opener(_HttpHandler(self), _HttpsHandler(self, context))

    def connect(self, address: tuple[str, int], timeout: object = None,
                source_address: Any = None) -> socket.socket:
        """``socket.create_connection``, within the time left, its socket watched."""
        sock = socket.create_connection(address, self.remaining(), source_address)
        self.watch(sock)
        return sock


def _cut(sock: socket.socket) -> None:
    """Shut the connection down under whatever is reading or writing it (the plain socket's
    own call, not SSLSocket's, which would unwrap the TLS state under the reader)."""
    with contextlib.suppress(OSError):  # closed or detached meanwhile: nothing to cut
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _WatchedContext:
    """An SSLContext's ``wrap_socket`` for http.client and smtplib (they call nothing else):
    the TLS socket is watched before its handshake, which a slow server could drip too."""

    def __init__(self, context: ssl.SSLContext, deadline: Deadline) -> None:
        self._context = context
        self._deadline = deadline

    def wrap_socket(self, sock: socket.socket, server_hostname: str | None = None,
                    **options: Any) -> ssl.SSLSocket:
        tls = self._context.wrap_socket(sock, server_hostname=server_hostname,
                                        do_handshake_on_connect=False, **options)
        self._deadline.watch(tls)
        tls.do_handshake()
        return tls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def _watched(connection: http.client.HTTPConnection,
             deadline: Deadline) -> http.client.HTTPConnection:
    # http.client opens its socket through this attribute (the hook its own tests use), so a
    # proxy's CONNECT is watched too.
    connection._create_connection = deadline.connect  # type: ignore[attr-defined]
    return connection


class _HttpHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(lambda host, **kw: _watched(
            http.client.HTTPConnection(host, **kw), self.deadline), req)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline, context: ssl.SSLContext) -> None:
        super().__init__()
        self.deadline = deadline
        self.tls = deadline.context(context)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(lambda host, **kw: _watched(http.client.HTTPSConnection(
            host, **{**kw, "context": self.tls}), self.deadline), req)
