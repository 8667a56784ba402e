"""Real processes against a real, private PostgreSQL: what the daemon tests and benchmarks use.

- ``PrivatePostgres``: a cluster of its own (``initdb`` + ``pg_ctl``) in a temporary directory,
  on a free port of 127.0.0.1 with trust auth, so a test may restart or stop it without touching
  the shared service on 5432. As root it runs the server as the ``postgres`` OS user (initdb
  refuses root), or as ``pgserver`` (created like the ``pgserver`` package does) when there is
  no ``postgres`` user. Binaries: ``$CRONKEEPER_PG_BINDIR``, ``pg_config --bindir``,
  ``/usr/lib/postgresql/*/bin``, ``initdb`` on PATH, then the ``pgserver`` package's own.
  ``shared_postgres()`` starts one per test process (stopped at exit). With ``netns=NAME`` the
  server runs inside that network namespace (``ip netns exec``), listening on
  ``listen_addresses`` there; the test itself then reaches it through its Unix socket, which
  the filesystem shares across namespaces, and ``tcp_url(address)`` is what a process in
  a namespace connects to. With ``data_dir=PATH`` the cluster's files (WAL included) live
  there, for example on a small filesystem the test mounts; the socket and the log stay in the
  temporary directory.
- ``Daemon``: one ``cronkeeper run`` process with JSON logs in a file, and ways to signal it and
  wait for its log lines.
- Queries the tests assert on: the leader row, the database clock, and the audit of the
  invariants (no period with two jobs, every due period decided exactly once).

Nothing here sleeps to wait for a race: ``wait_for`` polls an observable condition (rows, log
lines) until a deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.migrate import migrate
from cronkeeper.planning import idempotency_key
from cronkeeper.timing import make_trigger

T = TypeVar("T")
CRONKEEPER = str(Path(sys.executable).with_name("cronkeeper"))


# -- waiting ----------------------------------------------------------------------------------------
def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.02, *,
             alive: subprocess.Popen | None = None) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout``,
    or at once when ``alive`` (a process the condition depends on) has exited. The one polling
    helper of the tests (``handlers_for_tests.wait_until`` and the relay tests use it)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            last_error = exc  # the database may be restarting: keep polling
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"{what}: the process exited ({alive.returncode}) first")
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_error})" if last_error else ""
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}{extra}")
        time.sleep(interval)


# -- a private PostgreSQL -----------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bindir_candidates() -> Iterable[Path]:
    if os.environ.get("CRONKEEPER_PG_BINDIR"):
        yield Path(os.environ["CRONKEEPER_PG_BINDIR"])
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            yield Path(out.stdout.strip())
    for found in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        yield Path(found)
    initdb = shutil.which("initdb")
    if initdb:
        yield Path(os.path.realpath(initdb)).parent
    with contextlib.suppress(ImportError):
        import pgserver  # noqa: PLC0415 - last resort: the embedded server's binaries

        yield Path(pgserver.__file__).parent / "pginstall" / "bin"


def find_bindir() -> Path:
    for candidate in _bindir_candidates():
        if all((candidate / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return candidate
    raise RuntimeError(
        "no PostgreSQL server binaries found (initdb, pg_ctl, postgres): install PostgreSQL, "
        "set CRONKEEPER_PG_BINDIR, or pip install pgserver"
    )


def _server_user() -> str | None:
    """The OS user the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    subprocess.run(["useradd", "--system", "--no-create-home", "pgserver"], check=True,
                   capture_output=True)
    return "pgserver"


class PrivatePostgres:
    def __init__(self, *, fsync: bool = False, max_connections: int = 200,
                 settings: dict[str, str] | None = None, netns: str | None = None,
                 listen_addresses: str = "127.0.0.1", data_dir: Path | None = None) -> None:
        self.bindir = find_bindir()
        self.user = _server_user()
        self.root = Path(tempfile.mkdtemp(prefix="cronkeeper-pg-"))
        # the cluster's files (pg_wal included); the socket and the server log stay in root
        self.data = data_dir if data_dir is not None else self.root / "data"
        self.logfile = self.root / "server.log"
        self.port = _free_port()
        self.fsync = fsync
        self.max_connections = max_connections
        self.settings = dict(settings or {})
        self.netns = netns
        self.listen_addresses = listen_addresses
        self.database = "cronkeeper"
        self.running = False
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            if data_dir is not None:
                data_dir.mkdir(parents=True, exist_ok=True)
                os.chown(data_dir, entry.pw_uid, entry.pw_gid)
            if "pginstall" in str(self.bindir):  # the pgserver package's binaries, under the venv
                from pgserver.utils import (  # noqa: PLC0415
                    ensure_folder_permissions,
                    ensure_prefix_permissions,
                )

                ensure_prefix_permissions(self.bindir)
                ensure_folder_permissions(self.bindir.parent, 0o055)

    @property
    def url(self) -> str:
        """What this process connects to: loopback, or the Unix socket when the server runs in
        a network namespace of its own."""
        if self.netns is not None:
            return self._socket_url(self.database)
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def tcp_url(self, address: str) -> str:
        """The URL over TCP to one of ``listen_addresses`` (from a process that can route there)."""
        return f"postgresql://postgres@{address}:{self.port}/{self.database}"

    def _socket_url(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.root}&port={self.port}"

    def _run(self, tool: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        argv = [str(self.bindir / tool), *args]
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if result.returncode != 0:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(
                f"{tool} {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}\n{log[-2000:]}"
            )
        return result

    def _server_options(self) -> str:
        return " ".join([
            f"-p {self.port}", f"-k {self.root}", f"-c listen_addresses={self.listen_addresses}",
            f"-c max_connections={self.max_connections}", f"-c fsync={'on' if self.fsync else 'off'}",
            "-c synchronous_commit=on", *(f"-c {k}={v}" for k, v in self.settings.items()),
        ])

    def start(self) -> PrivatePostgres:
        if not (self.data / "PG_VERSION").exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                      "-E", "UTF8", "--no-sync", "--locale=C")
            if self.listen_addresses != "127.0.0.1":  # initdb trusts loopback only
                with open(self.data / "pg_hba.conf", "a") as hba:
                    hba.write("host all all samenet trust\n")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60",
                  "-o", self._server_options(), "start")
        self.running = True
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                  (self.database,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{self.database}"')
        return self

    @property
    def admin_url(self) -> str:
        if self.netns is not None:
            return self._socket_url("postgres")
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every session is ended; the server is back when this returns."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60",
                  "-m", "fast", "-o", self._server_options(), "restart")

    def crash_restart(self) -> None:
        """``pg_ctl stop -m immediate`` (every backend quits at once, no checkpoint: a crash, as
        far as the data directory knows), then start again through crash recovery."""
        self.crash()
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60",
                  "-o", self._server_options(), "start")
        self.running = True

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``, and stay down until ``start()`` (crash recovery)."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop")
        self.running = False

    def stop(self) -> None:
        if self.running:
            with contextlib.suppress(Exception):
                self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop")
            self.running = False
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.data, ignore_errors=True)

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=10)

    def new_schema(self) -> str:
        """A freshly migrated schema of its own."""
        name = f"d_{uuid.uuid4().hex[:12]}"
        engine = make_engine(normalize_url(self.url), "public", pool_size=1)
        try:
            migrate(engine, name)
        finally:
            engine.dispose()
        return name


_SHARED: PrivatePostgres | None = None


def shared_postgres() -> PrivatePostgres:
    """One private server per test process, started on first use and stopped at exit. A test
    that cannot get it fails (RuntimeError), it never skips."""
    global _SHARED
    if _SHARED is None:
        server = PrivatePostgres()
        atexit.register(server.stop)
        server.start()
        _SHARED = server
    return _SHARED


# -- schedule files -------------------------------------------------------------------------------------
def schedule_toml(name: str, *, cron: str | None = None, every: str | None = None,
                  misfire: str = "catch_up", catch_up_limit: str | None = "1h",
                  grace: str | None = None, overlap: str = "allow", task: str = "t.tick") -> str:
    lines = [f"[{name}]"]
    lines.append(f'cron = "{cron}"' if cron else f'every = "{every}"')
    lines += ['timezone = "UTC"', f'misfire = "{misfire}"']
    if misfire == "catch_up" and catch_up_limit:
        lines.append(f'catch_up_limit = "{catch_up_limit}"')
    if grace:
        lines.append(f'grace = "{grace}"')
    lines += [f'overlap = "{overlap}"', f'task = "{task}"', 'owner = "tests"', ""]
    return "\n".join(lines)


def write_schedules(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.toml"):
        if old.name not in files:
            old.unlink()
    for name, text in files.items():
        tmp = directory / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(directory / name)  # atomic: a reload never reads half a file
    os.chmod(directory, 0o755)
    return directory


def record_versions(pg: PrivatePostgres, schema: str, directory: Path, ago: timedelta) -> None:
    """Record the files' versions as a leader would have, ``ago`` in the past (an outage): a
    leader started now has every period of that time to decide (catch_up)."""
    from cronkeeper import clock  # noqa: PLC0415
    from cronkeeper.schedule import load_valid  # noqa: PLC0415

    specs = load_valid([str(directory)], now=clock.wall()).specs
    with set_path(pg.connect(), schema) as conn:
        for spec in specs:
            conn.execute(
                "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) "
                "VALUES (%s, %s, %s::jsonb, clock_timestamp() - %s, 1)",
                (spec.name, spec.digest, json.dumps(spec.to_json()), ago),
            )


# -- daemon processes --------------------------------------------------------------------------------------
def json_records(path: Path) -> list[dict[str, Any]]:
    """The JSON log records in a process's log file (lines that are not JSON objects left out)."""
    out: list[dict[str, Any]] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict):
                out.append(doc)
    return out


def spawn_json_worker(url: str, schema: str, cluster: str, instance_id: str, log_path: Path,
                      *extra: str) -> subprocess.Popen:
    """A ``cronkeeper worker`` importing tests/handlers_for_tests, its JSON log appended to
    ``log_path`` (read it with ``json_records``)."""
    tests = str(Path(__file__).parent)
    with open(log_path, "a") as out:
        return subprocess.Popen(
            [CRONKEEPER, "worker", "--database-url", url, "--schema", schema, "--cluster",
             cluster, "--import", "handlers_for_tests", "--poll-interval", "0.1",
             "--instance-id", instance_id, "--metrics-address", "off", "--log-format", "json",
             *extra],
            env={**os.environ, "PYTHONPATH": tests + os.pathsep + os.environ.get("PYTHONPATH", "")},
            stdout=out, stderr=out, stdin=subprocess.DEVNULL)


class Daemon:
    """One ``cronkeeper run`` process, its JSON log in ``log_path``."""

    def __init__(self, *, url: str, schema: str, cluster: str, schedules: Path, instance_id: str,
                 log_dir: Path, leader_timeout: float = 3, stall_timeout: float = 5,
                 extra: Iterable[str] = ()) -> None:
        self.instance_id = instance_id
        self.argv = [
            CRONKEEPER, "run", "--database-url", url, "--schema", schema, "--cluster", cluster,
            "--schedules", str(schedules), "--instance-id", instance_id,
            "--metrics-address", "off", "--log-format", "json",
            "--leader-timeout", str(leader_timeout), "--stall-timeout", str(stall_timeout), *extra,
        ]
        self.log_path = log_dir / f"{instance_id}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self._terminating = False

    def start(self) -> Daemon:
        self.starts += 1
        self._terminating = False
        log = open(self.log_path, "a")  # noqa: SIM115 - the child owns it from here
        log.write(json.dumps({"action": "harness_start", "n": self.starts}) + "\n")
        log.flush()
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)  # a stopped process cannot be reaped otherwise
                os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM once (a second one, while the interpreter exits, would kill it)."""
        if self.alive() and not self._terminating:
            self._terminating = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 15) -> int:
        """SIGTERM (graceful: the lock is released) and wait for the exit code."""
        assert self.proc is not None
        self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.instance_id} did not stop within {timeout}s of SIGTERM") from None

    def records(self, since_start: bool = True) -> list[dict[str, Any]]:
        """Parsed JSON log records (of the latest start only, by default)."""
        out: list[dict[str, Any]] = []
        for doc in json_records(self.log_path):
            if since_start and doc.get("action") == "harness_start":
                out = []
            out.append(doc)
        return out

    def wait_log(self, predicate: Callable[[dict[str, Any]], bool], timeout: float,
                 what: str) -> dict[str, Any]:
        def found():
            return next((r for r in self.records() if predicate(r)), None)
        return wait_for(found, timeout, f"{self.instance_id}: {what}")

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


class Fleet:
    """N daemons of one cluster, each with a stable instance id (a restart reuses it)."""

    def __init__(self, pg: PrivatePostgres, schema: str, schedules: Path, log_dir: Path,
                 n: int = 3, **options: Any) -> None:
        self.pg = pg
        self.schema = schema
        self.cluster = f"c-{uuid.uuid4().hex[:8]}"
        self.daemons = [
            Daemon(url=pg.url, schema=schema, cluster=self.cluster, schedules=schedules,
                   instance_id=f"node{i}", log_dir=log_dir, **options)
            for i in range(n)
        ]

    def start(self) -> Fleet:
        for d in self.daemons:
            d.start()
        return self

    def by_id(self, instance_id: str) -> Daemon:
        return next(d for d in self.daemons if d.instance_id == instance_id)

    def shutdown(self) -> None:
        for d in self.daemons:
            if d.alive():
                with contextlib.suppress(AssertionError):
                    d.stop(10)

    def logs(self) -> str:
        return "\n".join(f"--- {d.instance_id}\n{d.log_text()[-4000:]}" for d in self.daemons)


# -- what the tests look at --------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Leader:
    term: int
    instance_id: str
    backend_pid: int
    since: datetime
    heartbeat_at: datetime
    released_at: datetime | None


def set_path(conn: psycopg.Connection, schema: str) -> psycopg.Connection:
    conn.execute(f'SET search_path = "{schema}"')
    return conn


def leader_row(conn: psycopg.Connection, cluster: str) -> Leader | None:
    row = conn.execute(
        "SELECT term, instance_id, backend_pid, since, heartbeat_at, released_at "
        "FROM leadership WHERE cluster = %s", (cluster,)).fetchone()
    return Leader(*row) if row else None


def db_now(conn: psycopg.Connection) -> datetime:
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def wait_new_leader(conn: psycopg.Connection, cluster: str, after_term: int, timeout: float,
                    what: str = "a new leader") -> Leader:
    def check():
        row = leader_row(conn, cluster)
        return row if row and row.term > after_term and row.released_at is None else None
    return wait_for(check, timeout, what)


def lock_sessions(conn: psycopg.Connection, schema: str, cluster: str) -> dict[str, bool]:
    """{instance_id: granted} for every lock session on the cluster's advisory lock."""
    from cronkeeper.db.engine import advisory_key_parts, leader_lock_key  # noqa: PLC0415

    classid, objid = advisory_key_parts(leader_lock_key(schema, cluster))
    rows = conn.execute(
        """
        SELECT substr(a.application_name, length('cronkeeper-lock:') + 1), l.granted
        FROM pg_locks l JOIN pg_stat_activity a USING (pid)
        WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s AND l.objsubid = 1
          AND a.application_name LIKE 'cronkeeper-lock:%%'
        """, (classid, objid)).fetchall()
    return dict(rows)


@dataclass(frozen=True, slots=True)
class Audit:
    duplicate_jobs: list[tuple]  # (schedule, scheduled_for, count) with more than one job
    bad_keys: list[tuple]  # jobs whose idempotency key is not <schedule>@<scheduled_for>
    missing: list[tuple[str, datetime]]  # due periods with no outcome row
    unexpected: list[tuple[str, datetime]]  # outcome rows for instants the spec never fires
    emitted_without_job: list[tuple]
    job_without_emitted: list[tuple]
    periods: int
    jobs: int

    def problems(self) -> dict[str, list]:
        return {k: v for k, v in (
            ("duplicate_jobs", self.duplicate_jobs), ("bad_keys", self.bad_keys),
            ("missing", self.missing), ("unexpected", self.unexpected),
            ("emitted_without_job", self.emitted_without_job),
            ("job_without_emitted", self.job_without_emitted)) if v}


def audit(conn: psycopg.Connection, margin: float = 2.0, until: datetime | None = None) -> Audit:
    """Check the guarantees over everything due up to the db's now minus ``margin`` seconds:
    no period has two jobs, every key is ``<schedule>@<instant>``, and every period the versions
    in force imply has exactly one outcome row (the primary key makes "at most one" structural;
    this checks "at least one"), with one job per emitted period."""
    if until is None:
        until = db_now(conn) - timedelta(seconds=margin)
    duplicates = conn.execute(
        "SELECT schedule, scheduled_for, count(*) FROM outbox WHERE schedule IS NOT NULL"
        " GROUP BY 1, 2 HAVING count(*) > 1").fetchall()
    duplicates += conn.execute(
        "SELECT idempotency_key, NULL, count(*) FROM outbox GROUP BY 1 HAVING count(*) > 1").fetchall()
    jobs = conn.execute("SELECT idempotency_key, schedule, scheduled_for FROM outbox"
                        " WHERE schedule IS NOT NULL").fetchall()  # enqueued jobs have none
    bad_keys = [j for j in jobs if j[1] is not None and j[0] != idempotency_key(j[1], j[2])]
    versions = conn.execute(
        "SELECT schedule, spec, active_from FROM schedule_versions ORDER BY schedule, active_from, id"
    ).fetchall()
    decided: dict[str, set[datetime]] = {}
    for schedule, scheduled_for in conn.execute(
            "SELECT schedule, scheduled_for FROM periods WHERE scheduled_for <= %s", (until,)):
        decided.setdefault(schedule, set()).add(scheduled_for)
    missing: list[tuple[str, datetime]] = []
    expected_all: dict[str, set[datetime]] = {}
    for i, (schedule, spec, active_from) in enumerate(versions):
        nxt = versions[i + 1] if i + 1 < len(versions) else None
        end = nxt[2] if nxt is not None and nxt[0] == schedule else until
        if spec is None or active_from >= until:
            continue
        trigger = make_trigger(cron=spec.get("cron"), every=spec.get("every"),
                               timezone=spec["timezone"])
        expected = set(trigger.fires(active_from, min(end, until)))
        expected_all.setdefault(schedule, set()).update(expected)
        have = decided.get(schedule, set())
        missing += sorted((schedule, p) for p in expected - have)
    unexpected = sorted((s, p) for s, ps in decided.items() for p in ps - expected_all.get(s, set()))
    emitted_without_job = conn.execute(
        """SELECT p.schedule, p.scheduled_for FROM periods p
           LEFT JOIN outbox o USING (schedule, scheduled_for)
           WHERE p.outcome = 'emitted' AND o.id IS NULL""").fetchall()
    job_without_emitted = conn.execute(
        """SELECT o.schedule, o.scheduled_for FROM outbox o
           LEFT JOIN periods p USING (schedule, scheduled_for)
           WHERE o.schedule IS NOT NULL AND (p.outcome IS DISTINCT FROM 'emitted')""").fetchall()
    n_periods = conn.execute("SELECT count(*) FROM periods").fetchone()[0]
    return Audit(duplicates, bad_keys, missing, unexpected, emitted_without_job,
                 job_without_emitted, n_periods, len(jobs))


def assert_audit_clean(conn: psycopg.Connection, margin: float = 2.0, context: str = "") -> Audit:
    result = audit(conn, margin)
    problems = result.problems()
    assert not problems, f"{context}: guarantees broken: {problems}"
    assert result.periods > 0, f"{context}: nothing was decided at all"
    return result
