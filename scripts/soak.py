"""A soak under random faults (issue 9 §3): three `cronkeeper run` daemons, three
`cronkeeper worker`s, an application enqueueing jobs, and second-granularity schedules of every
misfire and overlap policy, on a PRIVATE PostgreSQL (initdb in a temporary directory, loopback
only), while a seeded random schedule of faults runs for ``--minutes``:

- SIGKILL of the leader, of a standby, of a worker (each restarted a moment later);
- SIGSTOP/SIGCONT of the leader, of a standby, of a worker (frozen for 1 to 7 s);
- ``pg_terminate_backend`` of every session of one process;
- PostgreSQL restarted (``pg_ctl restart -m fast``, or ``-m immediate`` stop and start: a crash);
- the network of one process cut (its loopback TCP relay stops moving bytes, 1 to 7 s).

Every daemon and worker reaches PostgreSQL through a relay of its own (tests/loopback_relay.py),
which is how a cut reaches one process and how its sessions are found (``client_port``).
Then everything is healed and restarted, the daemons are stopped once every period due is
decided, the workers once every job has ended, and the invariants are checked
(scripts/soak_checks.py). Prints the faults injected and each invariant with its result; exits
1 on any violation.

    .venv/bin/python scripts/soak.py --seed 7 --minutes 30 [--isolation thread,thread,process]
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
from datetime import timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE)]

import psycopg  # noqa: E402
from daemon_harness import (  # noqa: E402
    CRONKEEPER,
    Daemon,
    PrivatePostgres,
    audit,
    db_now,
    set_path,
    wait_for,
    write_schedules,
)
from loopback_relay import Relay  # noqa: E402
from soak_checks import (  # noqa: E402
    check_effects,
    check_fence,
    check_history,
    check_jobs,
    check_periods,
    check_processes,
)

import cronkeeper  # noqa: E402

KINDS = ("kill_leader", "kill_standby", "kill_worker", "stop_leader", "stop_standby",
         "stop_worker", "terminate_sessions", "pg_restart", "net_cut")
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


def isolation_supported() -> bool:
    out = subprocess.run([CRONKEEPER, "worker", "--help"], capture_output=True, text=True)
    return "--isolation" in out.stdout


class WorkerProc:
    """One ``cronkeeper worker`` process, restartable under the same id, JSON log in a file."""

    def __init__(self, url: str, schema: str, cluster: str, instance_id: str, isolation: str,
                 workdir: Path) -> None:
        self.instance_id = instance_id
        self.isolation = isolation
        self.log_path = workdir / f"{instance_id}.log"
        self.argv = [CRONKEEPER, "worker", "--database-url", url, "--schema", schema,
                     "--cluster", cluster, "--import", "soak_handlers", "--concurrency", "6",
                     "--poll-interval", "0.2", "--lease-margin", "2", "--drain-timeout", "5",
                     "--metrics-address", "off", "--log-format", "json"]
        if isolation != "thread" or isolation_supported():
            self.argv += ["--isolation", isolation]
        self.env = {**os.environ, "PYTHONPATH": str(HERE), "CRONKEEPER_INSTANCE_ID": instance_id,
                    "SOAK_RUN_LOG": str(workdir)}
        self.proc: subprocess.Popen | None = None

    def start(self) -> WorkerProc:
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.killpg(self.pid, sig)  # the worker and its handler processes: a frozen host

    def kill(self) -> None:
        """SIGKILL of the worker process alone (its handler children must notice by themselves)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


class Application(threading.Thread):
    """Enqueues jobs in its own transactions, each with the business row that needs it (the
    outbox pattern): ``app_orders`` and the job commit together or not at all. Talks to
    PostgreSQL directly and survives its restarts by reconnecting."""

    def __init__(self, url: str, schema: str, rate: float, rng: random.Random) -> None:
        super().__init__(daemon=True, name="application")
        self.url, self.schema, self.rate, self.rng = url, schema, rate, rng
        self.stopping = threading.Event()
        self.committed = 0
        self.failed = 0

    def run(self) -> None:
        seq = 0
        conn: psycopg.Connection | None = None
        while not self.stopping.wait(1.0 / self.rate):
            seq += 1
            key = f"app:{seq}"
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, connect_timeout=5)
                    set_path(conn, self.schema)
                    conn.commit()
                with conn.transaction():
                    conn.execute("INSERT INTO app_orders (key) VALUES (%s)", (key,))
                    chain = 2 if self.rng.random() < 0.1 else 0
                    cronkeeper.enqueue(conn, "soak.work", {"sleep": 0.5, "chain": chain, "hang": 5},
                                       key=key, schema=self.schema, timeout=2.0, max_attempts=4,
                                       backoff={"base": 0.3, "factor": 2, "max": 2})
                self.committed += 1
            except psycopg.Error:
                self.failed += 1  # the order and its job were both rolled back (or both kept)
                with contextlib.suppress(Exception):
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.pg = PrivatePostgres(max_connections=300)
        self.workdir = Path(args.workdir or self.pg.root / "soak")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.faults: Counter[str] = Counter()
        self.fault_log: list[str] = []
        self.timers: list[threading.Timer] = []
        self.frozen: set[int] = set()
        self.down: set[str] = set()  # killed on purpose, restart pending
        self.exits: list[str] = []  # processes that exited by themselves
        self.lock = threading.Lock()

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
                   leader_timeout=LEADER_TIMEOUT, stall_timeout=5)
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
    def _later(self, delay: float, action) -> None:
        timer = threading.Timer(delay, action)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

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
        if kind == "pg_restart":
            mode = rng.choice(("fast", "immediate"))
            (self.pg.restart if mode == "fast" else self.pg.crash_restart)()
            self._record(kind, f"mode={mode}")
            return True
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

            def restart(target=target):
                with self.lock:
                    self.down.discard(target.instance_id)
                    target.start()
            self._later(back, restart)
            self._record(kind, f"{name} (restarted after {back:.1f}s)")
        elif kind.startswith("stop_"):
            pid, length = target.pid, rng.uniform(1.0, 7.0)
            target.signal(signal.SIGSTOP)
            with self.lock:
                self.frozen.add(pid)

            def resume(pid=pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                with self.lock:
                    self.frozen.discard(pid)
            self._later(length, resume)
            self._record(kind, f"{name} for {length:.1f}s")
        elif kind == "terminate_sessions":
            ports = self.relays[name].upstream_ports()
            n = self._query("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                            " FROM pg_stat_activity WHERE client_port = ANY(%s)", (ports,))[0][0]
            self._record(kind, f"{name}: {n} sessions")
        elif kind == "net_cut":
            relay, length = self.relays[name], rng.uniform(1.0, 7.0)
            relay.cut()
            self._later(length, relay.heal)
            self._record(kind, f"{name} for {length:.1f}s")
        return True

    def _record(self, kind: str, what: str) -> None:
        self.faults[kind] += 1
        line = f"{time.monotonic() - self.t0:7.1f}s  {kind:<18} {what}"
        self.fault_log.append(line)
        print(line, flush=True)

    def run_faults(self) -> None:
        self.t0 = time.monotonic()
        end = self.t0 + self.args.minutes * 60
        todo = list(KINDS)
        self.rng.shuffle(todo)  # every kind early, so a short run injects each one
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(2.0, 6.0))
            if time.monotonic() >= end:
                break
            self._restart_exited()
            kind = todo.pop(0) if todo else self.rng.choice(KINDS)
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
        for timer in self.timers:
            timer.cancel()
        for relay in self.relays.values():
            relay.heal()
        for p in (*self.daemons, *self.workers):
            if p.proc is not None and p.alive():
                with contextlib.suppress(ProcessLookupError):
                    p.signal(signal.SIGCONT)
            elif p.proc is not None:
                p.start()
        self.frozen.clear()

    def settle(self) -> tuple:
        self.app.stopping.set()
        self.app.join(30)
        until = self._query("SELECT clock_timestamp()")[0][0] - timedelta(seconds=1)

        def decided():
            self.db = self.db if not self.db.closed else set_path(self.pg.connect(), self.schema)
            return not audit(self.db, until=until).missing
        with contextlib.suppress(AssertionError):
            wait_for(decided, 90, "every period due decided")
        for d in self.daemons:
            d.terminate()
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.proc.wait(20)
            d.kill()

        def finished():
            return self._query("SELECT count(*) FROM outbox WHERE state NOT IN"
                               " ('succeeded', 'dead')")[0][0] == 0
        with contextlib.suppress(AssertionError):
            wait_for(finished, self.args.settle, "every job ended", interval=0.5)
        for w in self.workers:
            with contextlib.suppress(ProcessLookupError):
                w.signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
        return until

    def check(self, until) -> int:
        db = self.db if not self.db.closed else set_path(self.pg.connect(), self.schema)
        logs = [d.log_path for d in self.daemons] + [w.log_path for w in self.workers]
        results = [
            *check_periods(db, until),
            check_history(self.pg.url, self.schema, self.started_at, until),
            check_jobs(db),
            check_effects(db, self.workdir),
            check_fence(db, [w.log_path for w in self.workers]),
            check_processes(logs),
        ]
        terms = db.execute("SELECT term FROM leadership WHERE cluster = %s", (self.cluster,)).fetchone()
        print("\nfaults injected:")
        for kind in KINDS:
            print(f"  {kind:<20} {self.faults[kind]}")
        print(f"  {'total':<20} {sum(self.faults.values())}")
        print(f"\napplication: {self.app.committed} enqueue transactions committed, "
              f"{self.app.failed} failed (rolled back with their order)")
        print(f"processes that exited by themselves (restarted): {self.exits or 'none'}")
        print(f"leadership terms: {terms[0] if terms else 0}; workers: "
              f"{', '.join(f'{w.instance_id}={w.isolation}' for w in self.workers)}")
        print("\ninvariants:")
        for r in results:
            print(f"  [{'PASS' if r.ok else 'FAIL'}] {r.name}\n         {r.detail}")
        failed = [r for r in results if not r.ok]
        print(f"\nsoak seed={self.args.seed} minutes={self.args.minutes}: "
              f"{'OK' if not failed else f'{len(failed)} INVARIANT(S) VIOLATED'}; logs in {self.workdir}")
        return 1 if failed else 0

    def cleanup(self) -> None:
        for timer in self.timers:
            timer.cancel()
        for p in (*self.daemons, *self.workers):
            with contextlib.suppress(Exception):
                p.kill()
            with contextlib.suppress(Exception):
                os.killpg(p.pid, signal.SIGKILL)  # handler processes left behind, if any
        for relay in self.relays.values():
            relay.close()
        if not self.args.keep:
            self.pg.stop()
        else:
            print(f"kept: {self.pg.root} (server on port {self.pg.port})")


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
    args = parser.parse_args()
    if args.isolation is None:
        args.isolation = "thread,thread,process" if isolation_supported() else "thread,thread,thread"
        if not isolation_supported():
            print("note: this cronkeeper worker has no --isolation: all three workers use threads")
    soak = Soak(args)
    try:
        soak.start()
        print(f"soak seed={args.seed} minutes={args.minutes} schema={soak.schema} "
              f"postgres port={soak.pg.port} logs={soak.workdir}", flush=True)
        soak.run_faults()
        soak.heal()
        until = soak.settle()
        return soak.check(until)
    except Exception:  # noqa: BLE001 - the soak itself broke: say how, exit non-zero
        traceback.print_exc()
        return 2
    finally:
        soak.cleanup()


if __name__ == "__main__":
    sys.exit(main())
