"""A soak under random faults (issue 9 §3): three `cronkeeper run` daemons, three
`cronkeeper worker`s, an application enqueueing jobs, and second-granularity schedules of every
misfire and overlap policy, on a PRIVATE PostgreSQL (initdb in a temporary directory, loopback
only), while a seeded random schedule of faults runs for ``--minutes``:

- SIGKILL of the leader, of a standby, of a worker (each restarted a moment later);
- SIGSTOP/SIGCONT of the leader, of a standby, of a worker (frozen for 1 to 7 s);
- ``pg_terminate_backend`` of every session of one process;
- PostgreSQL restarted (``pg_ctl restart -m fast``, or ``-m immediate`` stop and start: a crash);
- the network of one process cut (its loopback TCP relay stops moving bytes, 1 to 7 s);
- issue 21's faults (scripts/soak_faults.py): a clock that jumps, every connection slot taken,
  the disk full, a crash restart during a burst, a stalled leader.

Every daemon and worker reaches PostgreSQL through a relay of its own (tests/loopback_relay.py),
which is how a cut reaches one process and how its sessions are found (``client_port``).
Then everything is healed and restarted, the daemons are stopped once every period due is
decided, the workers once every job has ended, and the invariants are checked
(scripts/soak_checks.py). Prints the faults injected and each invariant with its result; exits
1 on any violation.

    .venv/bin/python scripts/soak.py --seed 7 --minutes 30 [--isolation thread,thread,process]
        [--without disk_full,...]

``disk_full`` mounts a tmpfs for the server's data (root only); ``clock_jump`` needs libfaketime
(Debian's ``faketime``). A fault that cannot be made here stops the soak at once, saying so.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE)]

import psycopg  # noqa: E402
import soak_end  # noqa: E402
import soak_faults  # noqa: E402
from daemon_harness import (  # noqa: E402
    Daemon,
    PrivatePostgres,
    db_now,
    set_path,
    wait_for,
    write_schedules,
)
from faults import server_running, small_tmpfs  # noqa: E402
from loopback_relay import Relay  # noqa: E402
from soak_procs import Application, WorkerProc, isolation_supported  # noqa: E402

KINDS = ("kill_leader", "kill_standby", "kill_worker", "stop_leader", "stop_standby",
         "stop_worker", "terminate_sessions", "pg_restart", "net_cut", *soak_faults.KINDS)
# Below LEADER_TIMEOUT: a leader whose tick hangs (stall_leader) is stepped down by its own
# watchdog before a standby deposes it for its silent heartbeat (the heartbeat waits behind it).
STALL_TIMEOUT = 2
LEADER_TIMEOUT = 3
BACKOFF = 'backoff = { base = "0.3s", factor = 2, max = "2s" }'


def schedules_toml() -> dict[str, str]:
    """Every misfire policy crossed with every overlap policy, firing every 1 to 3 seconds."""
    files = {}
    for i, misfire in enumerate(("skip", "catch_up", "latest")):
        lines = []
        for j, overlap in enumerate(("skip", "allow", "serial")):
            name = f"{misfire.replace('_', '-')}-{overlap}"
            every = ("1s", "2s", "3s")[(i + j) % 3]
            lines += [f"[{name}]", f'every = "{every}"', 'timezone = "UTC"',
                      f'misfire = "{misfire}"', f'overlap = "{overlap}"', 'task = "soak.work"',
                      'payload = { sleep = 0.8, hang = 5 }', 'grace = "2s"', 'timeout = "2s"',
                      "max_attempts = 4", BACKOFF, 'owner = "soak"']
            if misfire == "catch_up":
                lines.append('catch_up_limit = "20s"')
            lines.append("")
        files[f"{misfire}.toml"] = "\n".join(lines)
    files["cron.toml"] = "\n".join([
        "[cron-every-2s]", 'cron = "*/2 * * * * *"', 'timezone = "Europe/Berlin"',
        'misfire = "catch_up"', 'catch_up_limit = "1h"', 'overlap = "allow"', 'task = "soak.work"',
        'payload = { sleep = 0.3, chain = 1 }', 'timeout = "2s"', "max_attempts = 4", BACKOFF,
        'owner = "soak"', ""])
    return files


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.kinds = tuple(k for k in KINDS if k not in args.without)
        soak_faults.check_available(list(self.kinds), os.geteuid() == 0)
        self.mounts = contextlib.ExitStack()
        self.disk: Path | None = None
        settings: dict[str, str] = {}
        if "disk_full" in self.kinds:  # the cluster's files on a filesystem that can fill
            self.disk = self.mounts.enter_context(small_tmpfs(soak_faults.DISK_SIZE))
            settings |= soak_faults.DISK_SETTINGS
        max_connections = 300
        if "slots_exhausted" in self.kinds:  # small enough to fill, everyone a superuser
            max_connections = soak_faults.SMALL_MAX_CONNECTIONS
            settings["superuser_reserved_connections"] = "0"
        self.pg = PrivatePostgres(max_connections=max_connections, settings=settings,
                                  data_dir=self.disk / "data" if self.disk else None)
        self.workdir = Path(args.workdir or self.pg.root / "soak")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.faults: Counter[str] = Counter()
        self.fault_log: list[str] = []
        self.frozen: set[int] = set()
        self.down: set[str] = set()  # killed on purpose, restart pending
        self.exits: list[str] = []  # processes that exited by themselves
        self.lock = threading.Lock()
        self.stall_timeout = STALL_TIMEOUT
        self.healing = threading.Event()  # set by heal(): every pending heal runs now
        self.pending: list[threading.Thread] = []
        self.heals: list[tuple[str, datetime]] = []  # (kind, instant healed): recovery times
        self.server_fault: str | None = None  # at most one fault on the server at a time
        self.faked: set[str] = set()  # instances running under libfaketime
        self.disk_fills = self.disk_restarts = self.bursts = 0
        self.burst_threads: list[soak_faults.Burst] = []

    # -- setup ----------------------------------------------------------------------------------
    def start(self) -> None:
        self.pg.start()
        self.schema = self.pg.new_schema()
        self.cluster = "soak"
        self.db = set_path(self.pg.connect(), self.schema)
        self.db.execute("CREATE TABLE app_orders (key text PRIMARY KEY,"
                        " created_at timestamptz NOT NULL DEFAULT clock_timestamp())")
        self.db.execute("CREATE TABLE soak_effects (job_key text NOT NULL, worker_id text NOT NULL,"
                        " attempt int NOT NULL, pid int NOT NULL,"
                        " at timestamptz NOT NULL DEFAULT clock_timestamp())")
        self.db.execute("CREATE TABLE soak_completions (job_key text NOT NULL,"
                        " worker_id text NOT NULL, attempt int NOT NULL,"
                        " at timestamptz NOT NULL DEFAULT clock_timestamp())")
        schedules = write_schedules(self.workdir / "schedules", schedules_toml())
        self.relays: dict[str, Relay] = {}

        def via(name: str) -> str:
            relay = self.relays[name] = Relay(self.pg.port)
            return self.pg.url.replace(f":{self.pg.port}/", f":{relay.port}/")

        self.daemons = [
            Daemon(url=via(f"daemon{i}"), schema=self.schema, cluster=self.cluster,
                   schedules=schedules, instance_id=f"daemon{i}", log_dir=self.workdir,
                   leader_timeout=LEADER_TIMEOUT, stall_timeout=STALL_TIMEOUT)
            for i in range(3)]
        isolations = self.args.isolation.split(",")
        self.workers = [
            WorkerProc(via(f"worker{i}"), self.schema, self.cluster, f"worker{i}",
                       isolations[i % len(isolations)], self.workdir)
            for i in range(3)]
        self.started_at = db_now(self.db)
        for p in (*self.daemons, *self.workers):
            p.start()
        wait_for(lambda: self._leader() is not None, 30, "a leader")
        self.app = Application(self.pg.url, self.schema, self.args.rate, random.Random(self.args.seed + 1))
        self.app.start()

    def _leader(self) -> Daemon | None:
        row = self.db.execute("SELECT instance_id FROM leadership WHERE cluster = %s"
                              " AND released_at IS NULL", (self.cluster,)).fetchone()
        return next((d for d in self.daemons if row and d.instance_id == row[0]), None)

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """A statement on the soak's own connection, reconnecting after a restart."""
        for _ in range(20):
            try:
                return self.db.execute(sql, params).fetchall()
            except psycopg.OperationalError:
                with contextlib.suppress(Exception):
                    self.db.close()
                time.sleep(0.5)
                with contextlib.suppress(psycopg.OperationalError):
                    self.db = set_path(self.pg.connect(), self.schema)
        raise RuntimeError("the soak's own connection cannot reach PostgreSQL")

    # -- faults ---------------------------------------------------------------------------------
    def _later(self, delay: float, action, during=None) -> None:
        """Run ``action`` (a heal) after ``delay`` seconds, or at once when heal() begins;
        ``during`` is called every 0.3 s until then (keeping a fault in force)."""
        def wait_then_act() -> None:
            end = time.monotonic() + delay
            while not self.healing.wait(min(0.3, max(0.0, end - time.monotonic()))):
                if time.monotonic() >= end:
                    break
                if during is not None:
                    with contextlib.suppress(Exception):
                        during()
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - reported; heal() starts the server if need be
                print(f"healing failed: {exc!r}", flush=True)
                self.server_fault = None
        thread = threading.Thread(target=wait_then_act, daemon=True, name="heal")
        self.pending.append(thread)
        thread.start()

    def healed(self, kind: str) -> None:
        with self.lock:
            self.heals.append((kind, soak_faults.now()))

    def _usable(self, procs) -> list:
        return [p for p in procs if p.alive() and p.pid not in self.frozen]

    def _targets(self, kind: str) -> list:
        leader = None
        with contextlib.suppress(RuntimeError):
            row = self._query("SELECT instance_id FROM leadership WHERE cluster = %s"
                              " AND released_at IS NULL", (self.cluster,))
            leader = next((d for d in self.daemons if row and d.instance_id == row[0][0]), None)
        if kind.endswith("_leader"):
            return self._usable([leader] if leader else [])
        if kind.endswith("_standby"):
            return self._usable([d for d in self.daemons if d is not leader])
        if kind.endswith("_worker"):
            return self._usable(self.workers)
        return self._usable([*self.daemons, *self.workers])

    def inject(self, kind: str) -> bool:
        rng = self.rng
        if kind in soak_faults.SERVER_KINDS:
            if self.server_fault is not None:
                return False  # one fault on the server at a time
            self.server_fault = kind
            try:
                done = self._inject_server(kind)
            except BaseException:
                self.server_fault = None
                raise
            if not done:
                self.server_fault = None
            return done
        if kind in soak_faults.INJECT:
            what = soak_faults.INJECT[kind](self)
            if what is not None:
                self._record(kind, what)
            return what is not None
        targets = self._targets(kind)
        if not targets:
            return False
        target = rng.choice(targets)
        name = target.instance_id
        if kind.startswith("kill_"):
            with self.lock:
                self.down.add(name)
            target.kill()
            back = rng.uniform(0.5, 4.0)

            def restart(target=target, kind=kind):
                with self.lock:
                    self.down.discard(target.instance_id)
                    if not target.alive():
                        target.start()
                self.healed(kind)
            self._later(back, restart)
            self._record(kind, f"{name} (restarted after {back:.1f}s)")
        elif kind.startswith("stop_"):
            pid, length = target.pid, rng.uniform(1.0, 7.0)
            target.signal(signal.SIGSTOP)
            with self.lock:
                self.frozen.add(pid)

            def resume(pid=pid, target=target, kind=kind):
                with contextlib.suppress(ProcessLookupError):
                    target.signal(signal.SIGCONT)
                with self.lock:
                    self.frozen.discard(pid)
                self.healed(kind)
            self._later(length, resume)
            self._record(kind, f"{name} for {length:.1f}s")
        elif kind == "terminate_sessions":
            ports = self.relays[name].upstream_ports()
            n = self._query("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                            " FROM pg_stat_activity WHERE client_port = ANY(%s)", (ports,))[0][0]
            self.healed(kind)
            self._record(kind, f"{name}: {n} sessions")
        elif kind == "net_cut":
            relay, length = self.relays[name], rng.uniform(1.0, 7.0)
            relay.cut()

            def reconnect(relay=relay) -> None:
                relay.heal()
                self.healed("net_cut")
            self._later(length, reconnect)
            self._record(kind, f"{name} for {length:.1f}s")
        return True

    def _inject_server(self, kind: str) -> bool:
        """A fault on the server; the ones that last clear ``server_fault`` when healed."""
        if kind == "pg_restart":
            mode = self.rng.choice(("fast", "immediate"))
            (self.pg.restart if mode == "fast" else self.pg.crash_restart)()
            self.server_fault = None
            self.healed(kind)
            self._record(kind, f"mode={mode}")
            return True
        what = soak_faults.INJECT[kind](self)
        if what is not None:
            self._record(kind, what)
        return what is not None

    def _record(self, kind: str, what: str) -> None:
        self.faults[kind] += 1
        line = f"{time.monotonic() - self.t0:7.1f}s  {kind:<18} {what}"
        self.fault_log.append(line)
        print(line, flush=True)

    def run_faults(self) -> None:
        self.t0 = time.monotonic()
        end = self.t0 + self.args.minutes * 60
        todo = list(self.kinds)
        self.rng.shuffle(todo)  # every kind early, so a short run injects each one
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(2.0, 6.0))
            if time.monotonic() >= end:
                break
            self._restart_exited()
            kind = todo.pop(0) if todo else self.rng.choice(self.kinds)
            try:
                if not self.inject(kind):
                    todo.append(kind)  # no eligible target now (all frozen or dead): later
            except Exception as exc:  # noqa: BLE001 - a failed injection is reported, not fatal
                print(f"injecting {kind} failed: {exc}", flush=True)
                todo.append(kind)

    def _restart_exited(self) -> None:
        """A process that exited by itself is noted and started again (as systemd would)."""
        with self.lock:
            for p in (*self.daemons, *self.workers):
                if p.proc is not None and not p.alive() and p.instance_id not in self.down:
                    self.exits.append(f"{p.instance_id} exit {p.proc.returncode}")
                    print(f"{time.monotonic() - self.t0:7.1f}s  {p.instance_id} exited by itself "
                          f"(code {p.proc.returncode}): restarted", flush=True)
                    p.start()

    # -- the end --------------------------------------------------------------------------------
    def heal(self) -> None:
        self.healing.set()
        for thread in self.pending:  # each fault still in force is healed its own way
            thread.join(120)
        for burst in self.burst_threads:
            burst.join(300)
        if not server_running(self.pg):  # a restart that failed half-way: start it again
            print("PostgreSQL was left stopped: started again", flush=True)
            self.pg.start()
        for relay in self.relays.values():
            relay.heal()
        for p in (*self.daemons, *self.workers):
            if p.proc is not None and p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.signal(signal.SIGCONT)
            elif p.proc is not None:
                p.start()
        self.frozen.clear()

    def cleanup(self) -> None:
        self.healing.set()  # a fault still in force (a full disk) is healed first
        for thread in self.pending:
            thread.join(60)
        for p in (*self.daemons, *self.workers):
            with contextlib.suppress(Exception):
                p.kill()
            with contextlib.suppress(Exception):
                os.killpg(p.pid, signal.SIGKILL)  # handler processes left behind, if any
        for relay in self.relays.values():
            relay.close()
        if not self.args.keep:
            self.pg.stop()
            self.mounts.close()
        else:
            print(f"kept: {self.pg.root} (server on port {self.pg.port}; data in {self.pg.data}"
                  f"{', a tmpfs unmounted (lazily) as this process exits' if self.disk else ''})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--isolation", default=None,
                        help="isolation of the three workers, comma-separated (default: "
                             "thread,thread,process when the worker supports --isolation)")
    parser.add_argument("--rate", type=float, default=4.0, help="application jobs per second")
    parser.add_argument("--settle", type=float, default=120.0,
                        help="seconds the workers get to finish every job at the end")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the private PostgreSQL and logs")
    parser.add_argument("--without", default="", type=lambda s: [k for k in s.split(",") if k],
                        help=f"faults to leave out, comma-separated, of: {', '.join(KINDS)}")
    args = parser.parse_args()
    unknown = [k for k in args.without if k not in KINDS]
    if unknown:
        parser.error(f"--without: unknown fault(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    if args.isolation is None:
        args.isolation = "thread,thread,process" if isolation_supported() else "thread,thread,thread"
        if not isolation_supported():
            print("note: this cronkeeper worker has no --isolation: all three workers use threads")
    try:
        soak = Soak(args)
    except (AssertionError, OSError, subprocess.SubprocessError) as exc:
        print(f"soak: cannot start: {exc}", file=sys.stderr)
        return 2
    try:
        soak.start()
        print(f"soak seed={args.seed} minutes={args.minutes} schema={soak.schema} "
              f"postgres port={soak.pg.port} logs={soak.workdir}", flush=True)
        soak.run_faults()
        soak.heal()
        until = soak_end.settle(soak)
        return soak_end.check(soak, until)
    except Exception:  # noqa: BLE001 - the soak itself broke: say how, exit non-zero
        traceback.print_exc()
        return 2
    finally:
        soak.cleanup()


if __name__ == "__main__":
    sys.exit(main())
