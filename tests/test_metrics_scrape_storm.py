"""A storm of scrapes on a database that makes them wait must not take the pool a real
`cronkeeper worker` does its work with (docs/observability.md, "Scrapes share one read").

The scrapes are made to wait inside the database: the test holds an ACCESS EXCLUSIVE lock on
``leadership``, which the metrics read and a worker never touches (a migration's DDL or a
``VACUUM FULL`` does the same to a live fleet). Before the fix every scrape read on a pooled
connection of its own: thirty held all of the worker's, and its jobs waited until the lock went.
"""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest
import sqlalchemy as sa
from daemon_harness import wait_for
from handlers_for_tests import spawn_worker

import cronkeeper

SCRAPERS = 30  # more than the worker's pool: concurrency 2 + 4 of its own + 5 overflow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int, timeout: float = 120) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()


def _answers(port: int) -> str | None:
    try:
        return _scrape(port, 5)
    except OSError:
        return None


def _up(body: str | None) -> str | None:
    if body is None:
        return None

    for line in body.splitlines():
        if line.startswith("cronkeeper_database_up "):
            return line.split()[1]
    return None


@pytest.fixture
def worker(database_url, schema):
    port = _free_port()
    proc = spawn_worker(database_url, schema, "--concurrency", "2",
                        "--metrics-address", f"127.0.0.1:{port}")
    wait_for(lambda: _answers(port), 30, "the worker serves metrics", interval=0.2, alive=proc)
    yield proc, port
    proc.kill()
    proc.wait(10)


def _blocked_scrapes(engine) -> int:
    """The worker's backends waiting for the test's lock on this schema's ``leadership``: only
    the metrics read waits there (other tests' processes share the database, not the table)."""
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE NOT l.granted AND l.relation = 'leadership'::regclass "
            "AND a.application_name = 'cronkeeper-worker'")).scalar_one()


def test_a_scrape_storm_on_a_locked_table_leaves_the_worker_its_pool(engine, schema, worker):
    proc, port = worker
    stop = threading.Event()
    answers: list[str | None] = []

    def storm() -> None:  # each scraper asks again as soon as it is answered, as many replicas do
        while not stop.is_set():
            try:
                answers.append(_up(_scrape(port)))
            except OSError:
                answers.append("error")

    with engine.connect() as locker:
        locker.execute(sa.text("LOCK TABLE leadership IN ACCESS EXCLUSIVE MODE"))
        scrapers = [threading.Thread(target=storm, daemon=True) for _ in range(SCRAPERS)]
        try:
            for t in scrapers:
                t.start()
            wait_for(lambda: _blocked_scrapes(engine) >= 1, 30, "a scrape waits for the lock")
            with engine.begin() as conn:
                for i in range(3):
                    cronkeeper.enqueue(conn, "noop", {}, key=f"storm-{i}", schema=schema)
            most = [0]

            def done() -> bool:
                most[0] = max(most[0], _blocked_scrapes(engine))
                with engine.connect() as conn:
                    return conn.execute(sa.text(
                        "SELECT count(*) FROM outbox WHERE state = 'succeeded'")).scalar_one() == 3

            # the lock still held and the storm still on: the worker claims, runs and ends them
            wait_for(done, 60, "the worker ran its jobs during the storm", interval=0.1,
                     alive=proc)
            # the scrapes held one pooled connection between them, never the worker's pool
            assert most[0] <= 1, f"{most[0]} scrapes held pooled connections at once"
            # and the read behind the lock gave up: the scrapes answered, database_up 0
            wait_for(lambda: "0.0" in answers, 60, "a scrape answered database_up 0")
            assert "error" not in answers
        finally:
            locker.rollback()
            stop.set()
            for t in scrapers:
                t.join(150)
    wait_for(lambda: _up(_answers(port)) == "1.0", 30, "the figures are back after the lock")
