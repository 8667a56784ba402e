"""A webhook, Slack hook or heartbeat URL whose server certificate does not verify is a refusal
for good (docs/notifications.md: trying again cannot help; someone must fix the certificate
or trust its CA), as it already was for e-mail: before, it was retried until the tries were
spent, its error the bare SSL reason. A real HTTPS server on loopback with a self-signed
certificate (openssl)."""

from __future__ import annotations

import http.server
import ssl
import threading

import pytest
from notify_receivers import self_signed

from cronkeeper.notify.sinks import SendError, get, post


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def https_url(tmp_path):
    cert, key = self_signed(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/hook", cert
    finally:
        server.shutdown()
        server.server_close()


def test_a_certificate_that_does_not_verify_is_refused_for_good(https_url):
    url, _ = https_url
    with pytest.raises(SendError) as err:
        post(url, b"{}", {}, 5.0, name="sink 'ops'")
    assert err.value.permanent
    assert "certificate does not verify" in str(err.value)
    assert "SSL_CERT_FILE" in str(err.value)  # the way to trust a private CA
    with pytest.raises(SendError) as ping:
        get(url, 5.0)
    assert ping.value.permanent


def test_the_same_server_trusted_is_told(https_url, monkeypatch):
    url, cert = https_url
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # its CA trusted, as the error suggests
    post(url, b"{}", {}, 5.0, name="sink 'ops'")
    get(url, 5.0)
