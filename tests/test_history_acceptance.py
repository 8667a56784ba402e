"""Acceptance (§9): a `misfire = "skip"` schedule, every instance stopped for a while, then
restarted. `history` shows the periods of the outage as skipped (misfire) and exits 0; deleting
one outcome row by hand makes that period `missing` and the exit code 1."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from handlers_for_tests import wait_until
from test_metrics_daemon import spawn_daemon, stop

EVERY_5S = """
[five]
every = "5s"
timezone = "UTC"
misfire = "skip"
grace = "1s"
overlap = "allow"
task = "t.x"
owner = "team-a"
"""


def db_now(engine):
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()


def decided(engine, after) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT count(*) FROM periods WHERE schedule = 'five' AND scheduled_for > :t"),
            {"t": after}).scalar_one()


def history(database_url, schema, *args):
    exe = str(Path(sys.executable).with_name("cronkeeper"))
    return subprocess.run([exe, "history", "five", "--database-url", database_url, "--schema",
                           schema, "--format", "json", *args], capture_output=True, text=True)


def test_outage_is_skipped_by_misfire_and_a_deleted_outcome_is_missing(
        database_url, schema, cluster, engine, tmp_path):
    (tmp_path / "s.toml").write_text(EVERY_5S)
    started = db_now(engine)
    proc = spawn_daemon(database_url, schema, cluster, tmp_path)
    try:
        wait_until(lambda: decided(engine, started) >= 2, 40, message="two periods emitted")
    finally:
        stop(proc)
    down = db_now(engine)
    # the outage: every instance stopped while at least three periods come due
    wait_until(lambda: db_now(engine) > down + timedelta(seconds=16), 30, 0.5)
    up = db_now(engine)
    proc = spawn_daemon(database_url, schema, cluster, tmp_path, instance_id="two")
    try:
        wait_until(lambda: decided(engine, up) >= 1, 40, message="fires again after restart")
    finally:
        stop(proc)
    until = db_now(engine)
    since = (started - timedelta(seconds=1)).isoformat()
    result = history(database_url, schema, "--since", since, "--until", until.isoformat())
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(result.stdout)["periods"]
    outage = [r for r in rows if down < _utc(r) <= up]
    assert len(outage) >= 3
    assert {(r["status"], r["reason"]) for r in outage} == {("skipped", "misfire")}
    assert any(r["status"] == "emitted" for r in rows)
    assert not [r for r in rows if r["status"] == "missing"]

    victim = outage[1]["scheduled_for"]
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM periods WHERE schedule = 'five' AND scheduled_for = :t"),
                     {"t": victim})
    result = history(database_url, schema, "--since", since, "--until", until.isoformat())
    assert result.returncode == 1
    rows = json.loads(result.stdout)["periods"]
    assert [r["scheduled_for"] for r in rows if r["status"] == "missing"] == [victim]
    assert json.loads(result.stdout)["summary"][0]["missing"] == 1


def _utc(row):
    from datetime import datetime

    return datetime.fromisoformat(row["scheduled_for"].replace("Z", "+00:00"))
