"""Scrape the metrics endpoint of a real `cronkeeper run` daemon (a subprocess) and check the
figures after known events: leadership and term, fires of a second-granularity schedule,
outbox depth and the oldest ready job's age (no worker runs, so jobs wait)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from handlers_for_tests import wait_until

EVERY_SECOND = """
[tick]
cron = "* * * * * *"
timezone = "UTC"
misfire = "skip"
task = "t.x"
owner = "team-a"
overlap = "allow"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_daemon(database_url: str, schema: str, cluster: str, schedules: Path,
                 port: int | None = None, instance_id: str = "one") -> subprocess.Popen:
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    argv = [exe, "run", "--database-url", database_url, "--schema", schema, "--cluster", cluster,
            "--schedules", str(schedules), "--instance-id", instance_id,
            "--metrics-address", f"127.0.0.1:{port}" if port else "off"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env={**os.environ})


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def scrape(port: int) -> dict[str, float]:
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in body.splitlines():
        m = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


@pytest.fixture
def daemon(database_url, schema, cluster, tmp_path):
    (tmp_path / "s.toml").write_text(EVERY_SECOND)
    port = free_port()
    proc = spawn_daemon(database_url, schema, cluster, tmp_path, port)
    yield proc, port
    stop(proc)


def test_scrape_a_running_daemon(daemon, engine):
    proc, port = daemon
    m = wait_until(lambda: (s := scrape(port)) and s.get("cronkeeper_leader") == 1.0 and s,
                   message="the daemon leads and serves metrics")
    with engine.connect() as conn:
        term = conn.execute(sa.text("SELECT term FROM leadership")).scalar_one()
    assert m["cronkeeper_leader_term"] == float(term)
    fired = 'cronkeeper_fires_total{outcome="emitted",owner="team-a",reason="",schedule="tick"}'
    first = wait_until(lambda: scrape(port).get(fired, 0) >= 1, message="a first fire")
    assert first
    before = scrape(port)[fired]
    wait_until(lambda: scrape(port).get(fired, 0) >= before + 2, message="fires keep counting")
    s = scrape(port)
    with engine.connect() as conn:
        available = conn.execute(sa.text(
            "SELECT count(*) FROM outbox WHERE state = 'available'")).scalar_one()
    # jobs wait (no worker): depth from the database, within the fires of one more second
    assert abs(s['cronkeeper_outbox_jobs{state="available"}'] - available) <= 2
    assert s['cronkeeper_outbox_jobs{state="dead"}'] == 0
    assert s['cronkeeper_fire_lag_seconds_count{owner="team-a"}'] >= 3
    assert s['cronkeeper_instances{kind="scheduler"}'] == 1
    assert s['cronkeeper_schedule_digests{kind="scheduler"}'] == 1
    assert s["cronkeeper_database_up"] == 1
    assert 'cronkeeper_schedule_next_fire_timestamp_seconds{owner="team-a",schedule="tick"}' in s
    # the audit runs in a thread of its own, started by the first scrape
    wait_until(lambda: 'cronkeeper_periods_missing{owner="team-a",schedule="tick"}' in scrape(port),
               message="the audit's first result")
    assert "cronkeeper_clock_skew_seconds" in s
    age = 'cronkeeper_outbox_oldest_available_age_seconds{owner="team-a",schedule="tick"}'
    wait_until(lambda: scrape(port).get(age, 0) >= 1.0, message="the oldest job ages")


def test_metrics_bind_to_loopback_by_default():
    from cronkeeper.cli.common import parse_metrics_address

    assert parse_metrics_address(":9464") == ("127.0.0.1", 9464)
    assert parse_metrics_address("off") is None
