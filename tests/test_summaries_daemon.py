"""The leader's summary with a real `cronkeeper run` (tests/test_summaries.py tests the rest on
the database alone)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from daemon_harness import (
    Daemon,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)

from cronkeeper.cli.main import cli


@pytest.mark.slow
def test_a_running_leader_keeps_the_summary_status_reads(tmp_path):
    """A real `cronkeeper run`: its summarizer covers every schedule while it ticks, without
    a stall (its steps feed the watchdog: one term throughout), and `status` reads its figures
    from there; stopped (its lock released), status computes them live again."""
    pg = shared_postgres()
    schema = pg.new_schema()
    names = [f"s{i:03d}" for i in range(600)]
    schedules = write_schedules(tmp_path / "s", {"s.toml": "\n".join(
        schedule_toml(n, every=f"{30 + i % 7}s", misfire="skip") for i, n in enumerate(names))})
    daemon = Daemon(url=pg.url, schema=schema, cluster="sum", schedules=schedules,
                    instance_id="d1", log_dir=tmp_path, stall_timeout=5).start()
    db = set_path(pg.connect(), schema)
    db.autocommit = True

    def status() -> dict:
        out = CliRunner().invoke(cli, ["status", "--database-url", pg.url, "--schema", schema,
                                       "--cluster", "sum", "--format", "json"])
        assert out.exit_code == 0, out.output
        return json.loads(out.output)

    try:
        wait_for(lambda: db.execute("SELECT count(*) FROM schedule_summaries").fetchone()[0]
                 == len(names), 120, "a summary row per schedule", interval=0.5,
                 alive=daemon.proc)
        doc = status()
        assert doc["figures"]["summarized"] == len(names), doc["figures"]
        assert [s["name"] for s in doc["schedules"]] == names
        assert all(s["next_fire"] for s in doc["schedules"])
        terms = {r["term"] for r in daemon.records() if r.get("action") == "leader_won"}
        assert not [r for r in daemon.records() if r.get("action") == "leader_stalled"]
        assert len(terms) == 1
    finally:
        daemon.stop()
    doc = status()
    assert doc["leader"] is None and doc["figures"]["summarized"] == 0
    assert [s["name"] for s in doc["schedules"]] == names
