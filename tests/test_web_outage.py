"""`cronkeeper web` while its database goes away and comes back (SPEC §10): pages answer 503
with a message (security headers included, no traceback), the server keeps running, and the
same pages work again once the database is back. On a private PostgreSQL, since the shared
one must never be stopped."""

from __future__ import annotations

import http.client

from daemon_harness import PrivatePostgres, wait_for
from web_seed import Seeder, WebServer, spec

from cronkeeper.web.security import CSP


def get(server, path: str) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("GET", path)
    resp = conn.getresponse()
    return resp.status, dict(resp.headers), resp.read().decode()


def test_pages_say_the_database_is_unreachable_and_recover(tmp_path):
    pg = PrivatePostgres().start()
    server = None
    try:
        schema = pg.new_schema()
        with pg.connect() as conn:
            conn.execute(f'SET search_path = "{schema}"')
            s = Seeder(conn)
            s.version(spec("tick", every=60), "tick", s.now())
        server = WebServer(pg.url, schema, "outage", log=tmp_path / "web.log")
        assert get(server, "/")[0] == 200

        pg._run("pg_ctl", "-D", str(pg.data), "-w", "-m", "fast", "stop")  # the database goes away
        for path in ("/", "/schedules/tick", "/instances", "/queue", "/dlq", "/api/status",
                     "/explain/tick@2026-01-01T00:00:00Z", "/api/dlq"):
            status, headers, text = get(server, path)
            assert status == 503, (path, status, text[-500:])
            assert headers["Content-Security-Policy"] == CSP
            assert "Traceback" not in text, text[-500:]
            assert "the database could not answer" in text, (path, text[-500:])
        assert server.proc.poll() is None  # still serving

        pg.start()  # and comes back: the pool reconnects
        wait_for(lambda: get(server, "/")[0] == 200, 60, "the web to read again")
        status, _, text = get(server, "/schedules/tick")
        assert status == 200 and "every minute" in text
    finally:
        if server is not None:
            server.stop()
        pg.stop()
