"""The outage acceptance at full length (the tests run it compressed, with second-granularity
schedules): two `cronkeeper run` instances on minutely schedules, every instance stopped for
OUTAGE minutes, then restarted. Prints what `cronkeeper history` says per policy, then deletes
one outcome row and shows that `history` reports it missing and exits 1.

    python scripts/outage_drill.py [--outage-minutes 10] [--database-url URL]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

EXE = str(Path(sys.executable).with_name("cronkeeper"))
SCHEDULES = """
[minutely-skip]
cron = "* * * * *"
timezone = "UTC"
misfire = "skip"
overlap = "allow"
task = "drill.noop"
owner = "drill"

[minutely-catch-up]
cron = "* * * * *"
timezone = "UTC"
misfire = "catch_up"
catch_up_limit = "1h"
overlap = "allow"
task = "drill.noop"
owner = "drill"

[minutely-latest]
cron = "* * * * *"
timezone = "UTC"
misfire = "latest"
overlap = "allow"
task = "drill.noop"
owner = "drill"
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--outage-minutes", type=float, default=10)
    parser.add_argument("--database-url", default=os.environ.get(
        "CRONKEEPER_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    args = parser.parse_args()
    schema = f"drill_{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="ck-drill-"))
    (workdir / "s").mkdir()
    (workdir / "s" / "drill.toml").write_text(SCHEDULES)
    db = ["--database-url", args.database_url, "--schema", schema]
    subprocess.run([EXE, "migrate", *db], check=True)

    def start(n: int) -> list[subprocess.Popen]:
        return [subprocess.Popen([EXE, "run", *db, "--schedules", str(workdir / "s"),
                                  "--metrics-address", "off", "--instance-id", f"drill{i}"],
                                 stdout=subprocess.DEVNULL, stderr=open(workdir / f"d{i}.log", "a"))
                for i in range(n)]

    def stop(procs: list[subprocess.Popen]) -> None:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)

    def history(*extra: str) -> tuple[int, dict]:
        proc = subprocess.run([EXE, "history", *db, "--since", f"{int(args.outage_minutes) + 6}m",
                               "--format", "json", *extra], capture_output=True, text=True)
        return proc.returncode, json.loads(proc.stdout)

    procs = start(2)
    time.sleep(150)  # two or three on-time periods first
    stop(procs)
    print(f"all instances stopped for {args.outage_minutes} minutes", flush=True)
    time.sleep(args.outage_minutes * 60)
    procs = start(2)
    time.sleep(90)
    code, doc = history()
    print(f"history exit {code}")
    for row in doc["summary"]:
        print(f"  {row['schedule']}: emitted {row['emitted']}, skipped {row['skipped']}, "
              f"pending {row['pending']}, missing {row['missing']}")
    reasons: dict[str, dict[str, int]] = {}
    for p in doc["periods"]:
        if p["status"] == "skipped":
            reasons.setdefault(p["schedule"], {}).setdefault(p["reason"], 0)
            reasons[p["schedule"]][p["reason"]] += 1
    print(f"  skipped by reason: {reasons}")
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(f'SET search_path = "{schema}"')
        gone = conn.execute(
            "DELETE FROM periods WHERE (schedule, scheduled_for) = (SELECT schedule, scheduled_for"
            " FROM periods WHERE schedule = 'minutely-skip' AND outcome = 'skipped'"
            " ORDER BY scheduled_for LIMIT 1) RETURNING scheduled_for").fetchone()
    code, doc = history("minutely-skip")
    missing = [p["scheduled_for"] for p in doc["periods"] if p["status"] == "missing"]
    print(f"after deleting the outcome of {gone[0]:%Y-%m-%dT%H:%M:%SZ}: history exit {code}, "
          f"missing {missing}")
    stop(procs)
    with psycopg.connect(args.database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


if __name__ == "__main__":
    main()
