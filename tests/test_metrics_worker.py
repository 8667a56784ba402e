"""Scrape a real `cronkeeper worker`'s metrics endpoint after known events."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from handlers_for_tests import spawn_worker, wait_until

import cronkeeper


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@pytest.fixture
def worker(database_url, schema):
    port = _free_port()
    proc = spawn_worker(database_url, schema, "--metrics-address", f"127.0.0.1:{port}")
    yield port
    proc.kill()
    proc.wait(10)


def test_worker_metrics_count_successes_dead_letters_and_queue(engine, schema, worker):
    with engine.begin() as conn:
        for i in range(3):
            cronkeeper.enqueue(conn, "noop", {}, key=f"ok-{i}", schema=schema)
        cronkeeper.enqueue(conn, "permanent", {}, key="bad", schema=schema)

    def finished():
        with engine.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT count(*) FROM outbox WHERE state IN ('succeeded', 'dead')").scalar() == 4

    wait_until(finished, 30, message="the worker finished all four jobs")

    def scraped():
        values = _scrape(worker)
        return values if values.get(
            'cronkeeper_jobs_finished_total{outcome="succeeded",owner="",schedule=""}') == 3 else None

    values = wait_until(scraped, 15, message="the worker reported three successes")
    assert values['cronkeeper_jobs_finished_total{outcome="dead",owner="",schedule=""}'] == 1
    assert values['cronkeeper_job_failures_total{outcome="dead",owner="",schedule=""}'] == 1
    assert values['cronkeeper_jobs_started_total{owner="",schedule=""}'] == 4
    # figures from the database: the dead letter waits, nothing is available
    assert values['cronkeeper_dead_letters{owner="",schedule=""}'] == 1
    assert values['cronkeeper_outbox_jobs{state="succeeded"}'] == 3
    assert values['cronkeeper_outbox_jobs{state="available"}'] == 0
