"""Real receivers on loopback for the notification tests and the delivery benchmark: an HTTP
server (a webhook, a Slack incoming webhook, a heartbeat URL) and an SMTP server (aiosmtpd: a
real SMTP session, STARTTLS and SMTPS with a self-signed certificate, AUTH), each recording what
it received. Nothing here sleeps to wait: tests poll ``received`` with ``wait_for``."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.time() when it arrived (the benchmark's receiver clock)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class HttpReceiver:
    """``answers``: the statuses to answer in turn (then 200 for ever); ``hold``: while set,
    each request is recorded and then held unanswered until it is cleared (a sink that hangs)."""

    answers: list[int] = field(default_factory=list)
    received: list[Request] = field(default_factory=list)
    hold: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                receiver.received.append(Request(self.command, self.path, dict(self.headers),
                                                 body, time.time()))
                if receiver.hold.is_set():
                    receiver.released.wait(120)
                status = receiver.answers.pop(0) if receiver.answers else 200
                payload = b"ok" if status < 300 else b"no_service"
                with contextlib.suppress(OSError):
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

            do_POST = _handle  # noqa: N815
            do_GET = _handle  # noqa: N815

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def posts(self, path: str | None = None) -> list[Request]:
        return [r for r in self.received if r.method == "POST" and (path is None or r.path == path)]

    def gets(self) -> list[Request]:
        return [r for r in self.received if r.method == "GET"]

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by openssl (scripts/test-deps.sh)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True,
                   capture_output=True, timeout=60)
    return cert, key


@dataclass
class Mail:
    sender: str
    recipients: list[str]
    data: bytes
    tls: bool
    login: str | None
    at: float

    @property
    def message(self) -> Message:
        return message_from_bytes(self.data)


class SmtpReceiver:
    """aiosmtpd on 127.0.0.1: plain SMTP, SMTP offering STARTTLS (``tls=(cert, key)``), or
    SMTPS (``implicit=True``); with ``users``, AUTH PLAIN/LOGIN over TLS only."""

    def __init__(self, *, tls: tuple[Path, Path] | None = None, implicit: bool = False,
                 users: dict[str, str] | None = None) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        self.received: list[Mail] = []
        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802, ANN001
                login = session.auth_data.login.decode() if session.auth_data else None
                receiver.received.append(Mail(envelope.mail_from, list(envelope.rcpt_tos),
                                              envelope.original_content or envelope.content,
                                              bool(session.ssl) or server.transport.get_extra_info(
                                                  "ssl_object") is not None, login, time.time()))
                return "250 OK"

        def authenticate(server, session, envelope, mechanism, auth_data):  # noqa: ANN001
            if isinstance(auth_data, LoginPassword) and users is not None:
                ok = users.get(auth_data.login.decode()) == auth_data.password.decode()
                return AuthResult(success=ok, handled=False, auth_data=auth_data)
            return AuthResult(success=False, handled=False)

        context = None
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
        self.port = free_port()
        options: dict[str, Any] = {"hostname": "127.0.0.1", "port": self.port}
        if implicit:
            options["ssl_context"] = context
            options["server_hostname"] = "127.0.0.1"
        elif context is not None:
            options["tls_context"] = context
        if users is not None:
            options.update(authenticator=authenticate, auth_require_tls=True)
        self.controller = Controller(Handler(), **options)
        if implicit:  # the controller's own ready check speaks plain SMTP; it cannot here
            self.controller.ready_timeout = 10
        self.controller.start()

    def url(self, scheme: str = "smtp") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.controller.stop()


class Drip:
    """A service that answers a byte at a time, each byte well within any sink's timeout, for
    ``lasting`` seconds ("slow drip"): HTTP (``kind="http"``: it reads the request, then drips
    a status line and endless headers, and after ``lasting`` ends them with a 200) or SMTP
    (``kind="smtp"``: it drips an endless multi-line greeting, then hangs up). It records when
    each connection began and when the client let go of it (``spans``), and the requests' bodies
    (``bodies``)."""

    def __init__(self, kind: str = "http", *, every: float = 0.2, lasting: float = 60.0) -> None:
        self.kind, self.every, self.lasting = kind, every, lasting
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.spans: list[list[float]] = []  # [began, ended] (ended: 0.0 while it lasts)
        self.bodies: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        scheme = "smtp" if self.kind == "smtp" else "http"
        return f"{scheme}://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        span = [time.monotonic(), 0.0]
        self.spans.append(span)
        with conn, contextlib.suppress(OSError):
            if self.kind == "http":
                self.bodies.append(self._read_request(conn))
                head = b"HTTP/1.1 200 OK\r\n"
                line = b"X-Drip: a\r\n"
            else:
                head, line = b"", b"220-drip\r\n"
            end = span[0] + self.lasting
            stream = head
            while time.monotonic() < end:
                if not stream:
                    stream = line
                conn.sendall(stream[:1])
                stream = stream[1:]
                time.sleep(self.every)
            if self.kind == "http":
                conn.sendall(stream + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(5)
            while conn.recv(65536):
                pass
        span[1] = time.monotonic()

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        data = b""
        conn.settimeout(10)
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                       if h.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        conn.settimeout(None)
        return body

    def close(self) -> None:
        self.sock.close()
