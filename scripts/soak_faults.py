"""The faults of issue 21 in ``scripts/soak.py``'s random mix, each made the way its own test
makes it (through tests/faults.py), so that they can run unattended, at random, beside the
soak's other faults:

- ``clock_jump``: a daemon or worker restarted under libfaketime (its clock read from a file of
  its own), then its wall clock jumps (an hour or 90 s, forward or back, or back to true);
- ``slots_exhausted``: every free connection slot of the soak's server (a small
  ``max_connections``) taken by another client, cronkeeper's sessions ended, for 3 to 12 s;
- ``disk_full``: the filesystem under the server's data directory (a tmpfs the soak mounts, as
  root) filled until ``ENOSPC`` and kept full for 4 to 12 s, sometimes with a WAL segment switch
  asked for (the server then PANICs); then freed, and the server started again if it stopped,
  as docs/operations.md's runbook says;
- ``burst_pg_crash``: a burst of 300 to 800 jobs enqueued in batches, and PostgreSQL stopped
  ``-m immediate`` (a crash) and started again once the first batch has committed;
- ``stall_leader``: ``periods`` locked by another session for longer than the daemons'
  ``--stall-timeout``, so the leader's tick hangs and its watchdog must step it down.

The faults that take the server away (these, and the soak's ``pg_restart``) never overlap one
another: one at a time (``Soak.server_fault``). Each fault's heal is noted with its instant, from
which ``recovery`` measures how long until a period was decided and a job ran.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from daemon_harness import Daemon, set_path
from faults import (
    SlotHog,
    faked_daemon,
    faked_env,
    fill_disk,
    free_disk,
    libfaketime,
    server_running,
    set_offset,
)

import cronkeeper
from cronkeeper.errors import DatabaseError

if TYPE_CHECKING:
    from soak import Soak

HERE = Path(__file__).resolve().parent
KINDS = ("clock_jump", "slots_exhausted", "disk_full", "burst_pg_crash", "stall_leader")
SERVER_KINDS = frozenset({"pg_restart", "slots_exhausted", "disk_full", "burst_pg_crash"})
OFFSETS = ("+1h", "-1h", "+90s", "-90s", "+0")
DISK_SIZE = "512m"  # the soak's cluster: about 60 MB after 30 minutes, WAL capped below
DISK_SETTINGS = {"max_wal_size": "96MB", "min_wal_size": "32MB"}
SMALL_MAX_CONNECTIONS = 100  # the soak's fleet holds about 40 (docs/operations.md's sizing)


def check_available(kinds: list[str], root: bool) -> None:
    """Fail at once, plainly, when a fault asked for cannot be made on this machine."""
    if "clock_jump" in kinds:
        libfaketime()  # AssertionError naming the package to install
    if "disk_full" in kinds and not root:
        raise AssertionError("disk_full mounts a small filesystem for PostgreSQL's data: run the "
                             "soak as root, or leave the fault out (--without disk_full)")


def now() -> datetime:
    return datetime.now(UTC)


def clock_jump(soak: Soak) -> str | None:
    targets = [p for p in soak._usable([*soak.daemons, *soak.workers])
               if p.instance_id not in soak.down]
    if not targets:
        return None
    target = soak.rng.choice(targets)
    name = target.instance_id
    clock = soak.workdir / f"clock-{name}"
    offset = soak.rng.choice(OFFSETS)
    restarted = ""
    if name not in soak.faked:  # restarted under libfaketime once; its clock jumps from then on
        set_offset(clock, "+0")
        with soak.lock:
            soak.down.add(name)
            target.kill()
            if isinstance(target, Daemon):
                faked_daemon(target, faked_env(file=clock))
            else:
                target.env |= faked_env(file=clock, path=(str(HERE),))
            target.start()
            soak.down.discard(name)
        soak.faked.add(name)
        restarted = " (restarted under faketime)"
    set_offset(clock, offset)
    soak.healed("clock_jump")
    return f"{name} to {offset}{restarted}"


def slots_exhausted(soak: Soak) -> str | None:
    db = soak.pg.connect()  # before the slots go: what finds and ends cronkeeper's sessions
    hog = SlotHog(soak.pg, db)
    try:
        deadline = time.monotonic() + 20
        while not hog.squeeze():
            if time.monotonic() > deadline:
                raise RuntimeError("cronkeeper's sessions kept taking the freed slots: "
                                   f"{hog.cronkeeper_backends()}")
            time.sleep(0.05)
    except BaseException:
        hog.release()
        db.close()
        raise
    hold = soak.rng.uniform(3.0, 12.0)

    def free() -> None:
        hog.release()
        db.close()
        soak.server_fault = None
        soak.healed("slots_exhausted")
    soak._later(hold, free)
    return f"{len(hog.fillers)} slots taken for {hold:.1f}s"


def disk_full(soak: Soak) -> str | None:
    mount = soak.disk
    assert mount is not None
    soak.disk_fills += 1
    n = soak.disk_fills
    mode = soak.rng.choice(("data", "wal"))
    filled = fill_disk(mount, n)
    if mode == "wal":  # the next WAL write needs a new segment: the server PANICs
        with contextlib.suppress(psycopg.Error), soak.pg.connect() as conn:
            conn.execute("SELECT pg_switch_wal()")
    hold = soak.rng.uniform(4.0, 12.0)

    def free() -> None:
        free_disk(mount)
        started = restart_if_stopped(soak)
        soak.disk_restarts += started
        soak.server_fault = None
        soak.healed("disk_full")
    soak._later(hold, free, during=lambda: fill_disk(mount, n))  # a checkpoint frees WAL
    return f"{mode}: {filled >> 20} MB written until ENOSPC, full for {hold:.1f}s"


def restart_if_stopped(soak: Soak) -> bool:
    """The runbook's step 2: once space is free, start PostgreSQL if it stopped (a PANIC whose
    crash recovery failed); wait until it answers either way."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with soak.pg.connect():
                return False
        except psycopg.OperationalError:
            if not server_running(soak.pg):
                soak.pg.start()
                return True
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class Burst(threading.Thread):
    """``n`` jobs enqueued in batches of 50 (``enqueue_many``, each batch one transaction),
    retried after a lost connection (the keys make a retry write nothing twice)."""

    def __init__(self, soak: Soak, seq: int, n: int) -> None:
        super().__init__(daemon=True, name=f"burst-{seq}")
        self.soak, self.seq, self.n = soak, seq, n
        self.first = threading.Event()
        self.retries = 0

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        deadline = time.monotonic() + 300
        for start in range(0, self.n, 50):
            jobs: list[dict[str, Any]] = [
                {"task": "soak.work", "key": f"burst:{self.seq}:{i}", "timeout": 2.0,
                 "payload": {"sleep": 0.1, "hang": 5}, "max_attempts": 4,
                 "backoff": {"base": 0.3, "factor": 2, "max": 2}}
                for i in range(start, min(start + 50, self.n))]
            while time.monotonic() < deadline:
                try:
                    if conn is None or conn.closed:
                        conn = set_path(psycopg.connect(self.soak.pg.url, connect_timeout=5),
                                        self.soak.schema)
                        conn.commit()
                    with conn.transaction():
                        cronkeeper.enqueue_many(conn, jobs, schema=self.soak.schema)
                    break
                except (psycopg.Error, DatabaseError):
                    self.retries += 1
                    with contextlib.suppress(Exception):
                        conn.close()  # type: ignore[union-attr]
                    conn = None
                    time.sleep(0.3)
            self.first.set()
        if conn is not None:
            conn.close()


def burst_pg_crash(soak: Soak) -> str | None:
    soak.bursts += 1
    burst = Burst(soak, soak.bursts, soak.rng.randrange(300, 801))
    burst.start()
    soak.burst_threads.append(burst)
    burst.first.wait(30)
    soak.pg.crash_restart()
    soak.server_fault = None
    soak.healed("burst_pg_crash")
    return f"{burst.n} jobs enqueued in batches, crash after the first"


def stall_leader(soak: Soak) -> str | None:
    """``periods`` locked: the leader's next claim waits on it, its tick makes no progress."""
    conn = set_path(soak.pg.connect(), soak.schema)
    try:
        conn.execute("SET lock_timeout = '3s'")
        conn.execute("BEGIN")
        conn.execute("LOCK TABLE periods IN ACCESS EXCLUSIVE MODE")
    except psycopg.Error:
        conn.close()
        return None  # a fault in progress holds it (or the server went): later
    hold = soak.stall_timeout + soak.rng.uniform(1.0, 4.0)

    def unlock() -> None:
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK")
        conn.close()
        soak.healed("stall_leader")
    soak._later(hold, unlock)
    return f"periods locked for {hold:.1f}s (--stall-timeout {soak.stall_timeout:g})"


INJECT = {"clock_jump": clock_jump, "slots_exhausted": slots_exhausted, "disk_full": disk_full,
          "burst_pg_crash": burst_pg_crash, "stall_leader": stall_leader}


def recovery(db: psycopg.Connection, heals: list[tuple[str, datetime]],
             kinds: tuple[str, ...]) -> list[str]:
    """Per kind: seconds from each heal to the next period decided and to the next job that
    ran, as median and max (faults overlap, so a figure may include another fault's time)."""
    lines = [f"  {'fault':<20} {'n':>4}  {'period decided: median / max':>30}  "
             f"{'job ran: median / max':>24}"]
    for kind in kinds:
        decided, ran = [], []
        for k, at in heals:
            if k != kind:
                continue
            row = db.execute("SELECT (SELECT min(decided_at) FROM periods WHERE decided_at > %(t)s),"
                             " (SELECT min(finished_at) FROM attempts WHERE finished_at > %(t)s"
                             "  AND outcome = 'succeeded')", {"t": at}).fetchone()
            if row[0] is not None:
                decided.append((row[0] - at).total_seconds())
            if row[1] is not None:
                ran.append((row[1] - at).total_seconds())

        def shown(xs: list[float]) -> str:
            return f"{statistics.median(xs):.1f} / {max(xs):.1f} s" if xs else "-"
        n = sum(1 for k, _ in heals if k == kind)
        lines.append(f"  {kind:<20} {n:>4}  {shown(decided):>30}  {shown(ran):>24}")
    return lines
