"""The web's connections (docs/operations.md, "How many connections"): its pool holds every
connection its request threads can hold at once, so a status read (``operations.status.gather``
holds its own connection while two reads aside take one each) never waits for another
request's. Real ``cronkeeper web`` process, real PostgreSQL."""

from __future__ import annotations

import http.client
import re
import threading
import time

from web_seed import WebServer

THREADS = 12  # more request threads than the former pool's 10 connections (5 + 5)


def test_every_request_thread_reads_status_at_once(database_url, schema, cluster, tmp_path):
    """Twelve threads reading status at once (a dashboard polling ``/api/status``, people on
    ``/instances``) all answer at once. With the former pool (5 and 5 more) ten of them took
    every connection for their own reads, their reads aside waited for a connection none would
    give back, and after the pool's 30 s timeout they answered 503 ("no connection free in this
    process's pool"); reproduced with ``--threads 10`` and 16 as well."""
    server = WebServer(database_url, schema, cluster, "--threads", str(THREADS),
                       log=tmp_path / "web.log")
    answers: list[tuple[str, int, float]] = []
    failures: list[BaseException] = []
    go = threading.Barrier(THREADS)

    def reader(path: str) -> None:
        try:
            go.wait(30)
            end = time.monotonic() + 3
            while time.monotonic() < end:
                began = time.monotonic()
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                try:
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    body = resp.read().decode()
                finally:
                    conn.close()
                answers.append((path, resp.status, time.monotonic() - began))
                said = re.search(r"the database could not answer[^<\"]*", body)
                assert resp.status == 200, (path, resp.status, said and said.group(0))
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append(exc)

    readers = [threading.Thread(target=reader, args=("/api/status" if i % 2 else "/instances",))
               for i in range(THREADS)]
    try:
        for t in readers:
            t.start()
        for t in readers:
            t.join(120)
        assert server.proc.poll() is None
    finally:
        server.stop()
    assert not failures, failures[:3]
    assert answers and all(status == 200 for _, status, _ in answers)
    slowest = max(took for _, _, took in answers)
    assert slowest < 10, f"a status read waited {slowest:.1f} s for a connection"
    log = (tmp_path / "web.log").read_text()
    assert "QueuePool" not in log and "Traceback" not in log, log[-2000:]
