"""A runtime spec the application's host validated but a daemon's host cannot read (SPEC §10,
§15): the application's tz database knows a zone the daemons' older one does not. The leader
that adopts it says so (``version_unreadable``) and plans the rest; every later term must do
the same, not lose its leadership as though another leader had recorded the version, and go on
adopting the other runtime changes. Deleting the schedule records its removal.

Real daemons and a private PostgreSQL (tests/daemon_harness.py)."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import zoneinfo
from pathlib import Path

import psycopg
import pytest
from daemon_harness import (
    Daemon,
    leader_row,
    schedule_toml,
    set_path,
    shared_postgres,
    wait_for,
    write_schedules,
)

from cronkeeper import schedules

ZONE = "Mars/Olympus"  # known to the application's tz database only
SPEC = {"cron": "* * * * * *", "timezone": ZONE, "misfire": "skip", "task": "t.rt",
        "overlap": "allow", "owner": "tests"}
READABLE = {**SPEC, "timezone": "UTC"}


def newer_tzdata(directory: Path) -> Path:
    """A tz database directory: the one this host's zoneinfo reads, plus ``ZONE`` (as UTC)."""
    directory.mkdir()
    source = next((Path(d) for d in zoneinfo.TZPATH if (Path(d) / "tzdata.zi").is_file()), None)
    if source is None:
        source = Path(str(importlib.resources.files("tzdata.zoneinfo")))
    for name in ("tzdata.zi", "zone.tab", "UTC"):
        shutil.copy(source / name, directory / name)
    (directory / "Mars").mkdir()
    shutil.copy(source / "UTC", directory / ZONE)
    with open(directory / "tzdata.zi", "a") as f:
        f.write(f"Z {ZONE} 0 - UTC\n")
    return directory


def put_from_the_application_host(url: str, schema: str, tzpath: Path) -> None:
    """``schedules.put`` in a process whose tz database is ``tzpath``."""
    code = ("import sys, json, psycopg\nfrom cronkeeper import schedules\n"
            "with psycopg.connect(sys.argv[1]) as c:\n"
            "    schedules.put(c, 'mars', json.loads(sys.argv[3]), schema=sys.argv[2])\n"
            "    c.commit()\n")
    out = subprocess.run([sys.executable, "-c", code, url, schema, json.dumps(SPEC)],
                         env={**os.environ, "PYTHONTZPATH": str(tzpath)}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.fixture
def pg():
    return shared_postgres()


def test_an_unreadable_runtime_version_costs_no_term_and_blocks_no_adoption(pg, tmp_path):
    schema = pg.new_schema()
    files = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("file-tick", every="1s",
                                                                     misfire="skip")})
    conn = set_path(pg.connect(), schema)

    def daemon(name: str) -> Daemon:
        return Daemon(url=pg.url, schema=schema, cluster="ur", schedules=files,
                      instance_id=name, log_dir=tmp_path).start()

    def jobs(name: str) -> int:
        return conn.execute("SELECT count(*) FROM outbox WHERE schedule = %s",
                            (name,)).fetchone()[0]

    def put(name: str, spec: dict) -> None:
        with psycopg.connect(pg.url) as c:
            schedules.put(c, name, spec, schema=schema)
            c.commit()

    first = daemon("n1")
    second = None
    try:
        wait_for(lambda: leader_row(conn, "ur"), 30, "a leader")
        put_from_the_application_host(pg.url, schema, newer_tzdata(tmp_path / "tz"))
        first.wait_log(lambda r: r.get("action") == "version_unreadable"
                       and ZONE in r.get("message", ""), 10, "the spec it cannot read named")
        term = leader_row(conn, "ur").term
        first.kill()
        second = daemon("n2")
        wait_for(lambda: (row := leader_row(conn, "ur")) and row.term > term
                 and row.instance_id == "n2", 30, "n2 leads")
        second.wait_log(lambda r: r.get("action") == "leading", 20, "n2 caught up")
        put("after", READABLE)  # another runtime change: adopted by this term
        wait_for(lambda: jobs("after") >= 2, 20, "the next put fires")
        with psycopg.connect(pg.url) as c:  # deleting the unreadable one records its removal
            assert schedules.delete(c, "mars", schema=schema)
            c.commit()
        wait_for(lambda: conn.execute(
            "SELECT spec IS NULL FROM schedule_versions WHERE schedule = 'mars' "
            "ORDER BY active_from DESC, id DESC LIMIT 1").fetchone()[0], 10, "mars removed")
        lost = [r for r in second.records() if r.get("action") == "leader_lost"]
        assert lost == [], lost
        assert leader_row(conn, "ur").instance_id == "n2"
        assert jobs("mars") == 0
        assert "Traceback" not in second.log_text()
    finally:
        first.kill()
        if second is not None:
            second.kill()
        conn.close()
