"""A worker that is a container's PID 1 (its entrypoint, no init) inherits every orphan its
commands leave behind, and Python reaps none: they stay zombies until the container's PIDs run
out. It says so at start, naming the remedy. Real worker processes, one of them PID 1 of a new
PID namespace (``unshare``, util-linux; the tests run as root)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from handlers_for_tests import cronkeeper_exe, q, spawn_worker, wait_until


def _registered(engine, n: int) -> bool:
    return q(engine, "SELECT count(*) FROM instances WHERE role = 'worker'")[0][0] >= n


def _child_of(pid: int) -> int:
    """The process whose parent is ``pid`` (unshare's forked child: the namespace's PID 1)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            return int(stat.parent.name)
    raise AssertionError(f"no child of {pid}")


def test_a_worker_that_is_pid_one_says_it_needs_an_init(engine, schema, database_url):
    unshare = shutil.which("unshare")
    assert unshare, "unshare (util-linux) is needed for this test"
    plain = spawn_worker(database_url, schema)
    argv = [unshare, "--pid", "--fork", "--mount-proc", "--kill-child", cronkeeper_exe(), "worker",
            "--database-url", database_url, "--schema", schema, "--log-level", "warning",
            "--metrics-address", "off"]
    pid_one = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True)
    try:
        wait_until(lambda: _registered(engine, 2), 30, message="both workers registered")
    finally:
        # unshare ignores SIGTERM while it waits (its child handles it): the worker is told.
        os.kill(_child_of(pid_one.pid), signal.SIGTERM)
        plain.send_signal(signal.SIGTERM)
        outputs = [proc.communicate(timeout=30) for proc in (pid_one, plain)]
    (_, pid_one_err), (_, plain_err) = outputs
    assert "action=pid_one" in pid_one_err or '"pid_one"' in pid_one_err, pid_one_err
    assert "docker run --init" in pid_one_err
    assert "pid_one" not in plain_err, plain_err
