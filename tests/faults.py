"""The mechanisms of the fault tests (issue 21), shared by those tests, ``scripts/soak.py`` and
the benchmarks, so each fault is made one way only:

- a wrong or jumping clock: libfaketime (Debian's ``faketime``) preloaded into a process, its
  offset fixed (``FAKETIME``) or read from a file on every clock read, which ``set_offset``
  rewrites to make the clock jump; the monotonic clock is left alone, as a VM's clock step does;
- a server out of connections: ``SlotHog`` takes every free slot of a (small) server and ends
  cronkeeper's sessions, so each process must reconnect and is refused;
- a server out of disk: ``small_tmpfs`` mounts a small filesystem (as root) for its data
  directory, ``fill_disk`` fills it to ``ENOSPC``, ``server_running`` says whether PostgreSQL
  survived it (a full WAL stops it with a PANIC);
- a noisy neighbour: ``busy_loops`` that spin on the CPU, ``dsync_writer`` that writes to the
  disk with ``dd ... oflag=dsync`` in a loop.

Each process started here is ended by its own pid, never by name.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from daemon_harness import Daemon, PrivatePostgres

TESTS = Path(__file__).parent
SITE = TESTS / "faketime_site"  # sitecustomize: time.sleep despite libfaketime 0.9.10's bug
LIBFAKETIME_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
    "/usr/local/lib/faketime/libfaketimeMT.so.1",
)


# -- the clock ----------------------------------------------------------------------------------
def libfaketime() -> str:
    """The preload library; a test that needs it fails (never skips) without it."""
    for path in LIBFAKETIME_CANDIDATES:
        if os.path.isfile(path):
            return path
    raise AssertionError(
        "libfaketime not found (looked for " + ", ".join(LIBFAKETIME_CANDIDATES) + "): install "
        "Debian's faketime package (scripts/test-deps.sh does: apt-get install faketime)")


def faked_env(*, offset: str | None = None, file: Path | None = None,
              path: tuple[str, ...] = ()) -> dict[str, str]:
    """Environment that runs a process with its wall clock at ``offset`` (``-1h``), or at the
    offset written in ``file`` (re-read on every clock read), its monotonic clock untouched.
    ``path``: more folders for its ``PYTHONPATH`` (handler modules)."""
    env = {"LD_PRELOAD": libfaketime(), "FAKETIME_DONT_FAKE_MONOTONIC": "1",
           "PYTHONPATH": os.pathsep.join([str(SITE), str(TESTS), *path,
                                          os.environ.get("PYTHONPATH", "")])}
    if file is not None:
        env |= {"FAKETIME_TIMESTAMP_FILE": str(file), "FAKETIME_NO_CACHE": "1"}
    else:
        assert offset is not None
        env["FAKETIME"] = offset
    return env


def set_offset(file: Path, offset: str) -> None:
    """Make the clocks reading ``file`` jump to ``offset`` (``+1h``, ``-30s``, ``+0``)."""
    tmp = file.with_suffix(".tmp")
    tmp.write_text(offset + "\n")
    tmp.chmod(0o644)
    tmp.replace(file)  # atomic: a clock read never sees half a line


def faked_daemon(daemon: Daemon, env: dict[str, str]) -> Daemon:
    """``daemon`` started under ``env`` (from ``faked_env``) from now on."""
    daemon.argv = ["env", *(f"{k}={v}" for k, v in env.items()), *daemon.argv]
    return daemon


# -- connections ----------------------------------------------------------------------------------
class SlotHog:
    """Another service that takes every free connection slot of ``pg`` (run it with
    ``superuser_reserved_connections=0``: everyone here is a superuser). ``db`` is a session
    opened before, used to find and end cronkeeper's sessions."""

    def __init__(self, pg: PrivatePostgres, db: psycopg.Connection) -> None:
        self.pg, self.db = pg, db
        self.fillers: list[psycopg.Connection] = []

    def cronkeeper_backends(self) -> list[int]:
        return [pid for (pid,) in self.db.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'cronkeeper%%'")]

    def fill(self) -> None:
        """Take every free slot; the server refusing one more is what cronkeeper meets."""
        while True:
            try:
                self.fillers.append(psycopg.connect(self.pg.url, autocommit=True,
                                                    application_name="filler", connect_timeout=5))
            except psycopg.OperationalError as exc:
                assert "too many clients" in str(exc), exc
                return

    def squeeze(self) -> bool:
        """Fill, end every cronkeeper session, fill the slots they freed; true once none of
        theirs is left (a process may take a freed slot before the filler does: call again)."""
        self.fill()
        for pid in self.cronkeeper_backends():
            self.db.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
            self.fill()  # the slot it freed, before its process reconnects
        return not self.cronkeeper_backends()

    def release(self) -> None:
        for conn in self.fillers:
            with contextlib.suppress(Exception):
                conn.close()
        self.fillers.clear()


# -- disk -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``96m``), mounted for the block and unmounted after it, whatever
    happened. Needs root: fails plainly otherwise."""
    if os.geteuid() != 0:
        raise AssertionError("mounting a small filesystem needs root")
    mount = Path(tempfile.mkdtemp(prefix="cronkeeper-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "cronkeeper-disk",
                    str(mount)], check=True, capture_output=True, text=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True)
        with contextlib.suppress(OSError):
            mount.rmdir()


def fill_disk(directory: Path, n: int) -> int:
    """Write ``directory/filler-N`` until the filesystem says ENOSPC; the bytes written."""
    written = 0
    with open(directory / f"filler-{n}", "ab", buffering=0) as out:
        for chunk in (1 << 20, 1 << 12):
            block = b"\0" * chunk
            while True:
                try:
                    written += out.write(block) or 0
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return written


def free_disk(directory: Path) -> None:
    """Delete what ``fill_disk`` wrote."""
    for filler in directory.glob("filler-*"):
        filler.unlink()


def server_running(pg: PrivatePostgres) -> bool:
    """``pg_ctl status``: 0 while the postmaster runs, 3 when it does not."""
    argv = [str(pg.bindir / "pg_ctl"), "-D", str(pg.data), "status"]
    if pg.user is not None:
        argv = ["runuser", "-u", pg.user, "--", *argv]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


# -- a noisy neighbour ---------------------------------------------------------------------------
@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[list[subprocess.Popen]]:
    """``n`` processes that spin on the CPU, ended by their pid."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def dsync_writer(directory: Path, mb: int = 64) -> Iterator[subprocess.Popen]:
    """One process writing ``mb`` MiB to a file in ``directory`` with ``dd ... oflag=dsync``
    (every block waits for the disk), over and over, in its own process group, ended with it."""
    target = Path(tempfile.mkstemp(prefix="dsync-", dir=directory)[1])
    loop = (f"while :; do dd if=/dev/zero of={target} bs=1M count={mb} oflag=dsync "
            "status=none; done")
    proc = subprocess.Popen(["sh", "-c", loop], start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait(10)
        target.unlink(missing_ok=True)
