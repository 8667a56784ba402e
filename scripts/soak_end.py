"""The end of ``scripts/soak.py``: everything settled, then each invariant checked
(scripts/soak_checks.py) and the report printed: the faults injected by kind, the recovery
after each, and each invariant with what it counted."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections import Counter
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import soak_faults
from daemon_harness import audit, json_records, set_path, wait_for
from soak_checks import (
    check_effects,
    check_fence,
    check_history,
    check_jobs,
    check_periods,
    check_processes,
)

if TYPE_CHECKING:
    from soak import Soak


def settle(soak: Soak) -> datetime:
    """Stop the application, let a leader decide every period due, stop the daemons, let the
    workers end every job, stop them; the instant the checks look up to."""
    soak.app.stopping.set()
    soak.app.join(30)
    until = soak._query("SELECT clock_timestamp()")[0][0] - timedelta(seconds=1)

    def decided():
        soak.db = soak.db if not soak.db.closed else set_path(soak.pg.connect(), soak.schema)
        return not audit(soak.db, until=until).missing
    with contextlib.suppress(AssertionError):
        wait_for(decided, 90, "every period due decided")
    for d in soak.daemons:
        d.terminate()
    for d in soak.daemons:
        with contextlib.suppress(Exception):
            d.proc.wait(20)
        d.kill()

    def finished():
        return soak._query("SELECT count(*) FROM outbox WHERE state NOT IN"
                           " ('succeeded', 'dead')")[0][0] == 0
    with contextlib.suppress(AssertionError):
        wait_for(finished, soak.args.settle, "every job ended", interval=0.5)
    for w in soak.workers:
        with contextlib.suppress(ProcessLookupError):
            w.signal(signal.SIGTERM)
    for w in soak.workers:
        try:
            w.proc.wait(30)
        except subprocess.TimeoutExpired:
            w.kill()
    return until

def check(soak: Soak, until: datetime) -> int:
    """Check every invariant and print the report; 1 when one is violated."""
    db = soak.db if not soak.db.closed else set_path(soak.pg.connect(), soak.schema)
    logs = [d.log_path for d in soak.daemons] + [w.log_path for w in soak.workers]
    results = [
        *check_periods(db, until),
        check_history(soak.pg.url, soak.schema, soak.started_at, until),
        check_jobs(db),
        check_effects(db, soak.workdir),
        check_fence(db, [w.log_path for w in soak.workers]),
        check_processes(logs),
    ]
    terms = db.execute("SELECT term FROM leadership WHERE cluster = %s", (soak.cluster,)).fetchone()
    print("\nfaults injected:")
    for kind in soak.kinds:
        print(f"  {kind:<20} {soak.faults[kind]}")
    print(f"  {'total':<20} {sum(soak.faults.values())}")
    print("\nrecovery after each heal (to the next period decided, the next job succeeded):")
    print("\n".join(soak_faults.recovery(db, soak.heals, soak.kinds)))
    print(f"\nbursts: {soak.bursts}, {sum(b.n for b in soak.burst_threads)} jobs, "
          f"{sum(b.retries for b in soak.burst_threads)} batches retried; disk filled "
          f"{soak.disk_fills} times, PostgreSQL started again after {soak.disk_restarts}; "
          f"instances under faketime: {sorted(soak.faked) or 'none'}")
    print(f"\napplication: {soak.app.committed} enqueue transactions committed, "
          f"{soak.app.failed} failed (rolled back with their order)")
    print(f"processes that exited by themselves (restarted): {soak.exits or 'none'}")
    said = Counter(r.get("action") for d in soak.daemons for r in json_records(d.log_path))
    print(f"daemons' log: {said['leader_won']} terms won, {said['leader_stalled']} stepped down "
          f"by the stall watchdog, {said['db_unavailable']} said the database was away")
    print(f"leadership terms: {terms[0] if terms else 0}; workers: "
          f"{', '.join(f'{w.instance_id}={w.isolation}' for w in soak.workers)}")
    print("\ninvariants:")
    for r in results:
        print(f"  [{'PASS' if r.ok else 'FAIL'}] {r.name}\n         {r.detail}")
    failed = [r for r in results if not r.ok]
    print(f"\nsoak seed={soak.args.seed} minutes={soak.args.minutes}: "
          f"{'OK' if not failed else f'{len(failed)} INVARIANT(S) VIOLATED'}; logs in {soak.workdir}")
    return 1 if failed else 0
