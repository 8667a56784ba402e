"""The soak (scripts/soak.py) for a minute and a half, as part of the suite: three daemons, three
workers and an application on a private PostgreSQL under seeded random faults, issue 21's among
them (a clock that jumps, every connection slot taken, the disk full, a crash restart during a
burst, a stalled leader). It must exit 0 (every invariant held) and must actually have injected
a fault of every kind (parsed from its report), so a soak that silently injected nothing cannot
pass. As root (the disk fault mounts a tmpfs), with libfaketime installed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("kill_leader", "kill_standby", "kill_worker", "stop_leader", "stop_standby",
         "stop_worker", "terminate_sessions", "pg_restart", "net_cut", "clock_jump",
         "slots_exhausted", "disk_full", "burst_pg_crash", "stall_leader")
INVARIANTS = (
    "every period has exactly one outcome",
    "no period produced two jobs",
    "history reports nothing missing",
    "every emitted or enqueued job ended succeeded or dead with a reason",
    "no job's effect happened twice",
    "no completion recorded by a worker that had lost its lease",
)


@pytest.mark.timeout(900)
def test_short_soak_under_every_fault_kind_keeps_every_invariant():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak.py"), "--minutes", "1.5",
                           "--seed", "20261201"], capture_output=True, text=True, timeout=850)
    out = proc.stdout + proc.stderr
    print(out[-6000:])
    assert proc.returncode == 0, f"soak exited {proc.returncode}:\n{out[-4000:]}"
    table = out.split("faults injected:", 1)[1].split("\n\n", 1)[0]
    counts = {m[1]: int(m[2]) for m in re.finditer(r"^\s+([a-z_]+)\s+(\d+)$", table, re.M)}
    assert {k: counts.get(k, 0) for k in KINDS if counts.get(k, 0) < 1} == {}, table
    recovery = out.split("recovery after each heal", 1)[1].split("\n\n", 1)[0]
    healed = {m[1]: int(m[2]) for m in re.finditer(r"^\s+([a-z_]+)\s+(\d+)\s", recovery, re.M)}
    assert all(healed.get(k, 0) >= 1 for k in KINDS), recovery  # each fault also ended
    for name in INVARIANTS:
        assert f"[PASS] {name}" in out, f"{name!r} not reported as passed"
    assert "[FAIL]" not in out
    jobs = re.search(r"jobs by state \{([^}]*)\}", out)
    assert jobs and "'succeeded'" in jobs[1], "the soak ran no job to success"
