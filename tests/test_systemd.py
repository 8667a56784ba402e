"""The shipped units pass `systemd-analyze verify`, and sd_notify reaches a real socket."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cronkeeper import systemd

UNITS = Path(__file__).resolve().parent.parent / "systemd"


def _installed_copy(tmp_path: Path, unit: str, instance: str | None = None) -> Path:
    """The unit as installed, with ExecStart pointing at this environment's cronkeeper (verify
    checks that the command exists); every other line is verified as shipped."""
    cronkeeper = Path(sys.executable).with_name("cronkeeper")
    text = (UNITS / unit).read_text().replace("/opt/cronkeeper/bin/cronkeeper", str(cronkeeper))
    name = unit.replace("@.", f"@{instance}.") if instance else unit
    target = tmp_path / name
    target.write_text(text)
    return target


@pytest.mark.parametrize(("unit", "instance"), [("cronkeeper.service", None), ("cronkeeper-worker@.service", "1"),
                                             ("cronkeeper-relay@.service", "1")])
def test_units_verify(tmp_path, unit, instance):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is needed (Debian package systemd)"
    path = _installed_copy(tmp_path, unit, instance)
    result = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@pytest.mark.parametrize("unit", ["cronkeeper.service", "cronkeeper-worker@.service",
                                  "cronkeeper-relay@.service"])
def test_units_are_hardened(unit):
    text = (UNITS / unit).read_text()
    for line in ("NoNewPrivileges=yes", "ProtectSystem=strict", "DynamicUser=yes", "ProtectHome=yes"):
        assert line in text, (unit, line)


def test_scheduler_unit_is_type_notify_with_watchdog():
    text = (UNITS / "cronkeeper.service").read_text()
    assert "Type=notify" in text and "WatchdogSec=" in text and "ExecReload=/bin/kill -HUP $MAINPID" in text


def test_notify_writes_to_the_socket(tmp_path, monkeypatch):
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert systemd.notify("READY=1") is True
        assert sock.recv(100) == b"READY=1"


def test_notify_without_systemd_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.notify("READY=1") is False


@contextlib.contextmanager
def notifying_daemon(tmp_path, database_url, schema, cluster, **env):
    """A real `cronkeeper run` with NOTIFY_SOCKET bound here; yields (socket, process)."""
    sched = tmp_path / "schedules"
    sched.mkdir()
    (sched / "a.toml").write_text(
        '[ping]\nevery = "60s"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.ping"\nowner = "ops"\n'
    )
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(30)
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("cronkeeper")), "run", "--database-url", database_url,
             "--schema", schema, "--cluster", cluster, "--schedules", str(sched),
             "--metrics-address", "off"],
            env={**os.environ, "NOTIFY_SOCKET": str(path), **env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        try:
            yield sock, proc
        finally:
            proc.kill()
            proc.wait()


def test_daemon_reports_ready_then_stopping(tmp_path, database_url, schema, cluster):
    with notifying_daemon(tmp_path, database_url, schema, cluster) as (sock, proc):
        assert sock.recv(200).startswith(b"READY=1")
        proc.send_signal(signal.SIGTERM)
        assert sock.recv(200) == b"STOPPING=1"
        assert proc.wait(timeout=30) == 0


def test_daemon_pings_the_watchdog_while_it_makes_progress(tmp_path, database_url, schema, cluster):
    with notifying_daemon(tmp_path, database_url, schema, cluster, WATCHDOG_USEC="1000000") as (sock, _):
        messages = [sock.recv(200) for _ in range(4)]
        assert messages[0].startswith(b"READY=1") or b"READY=1" in messages
        assert messages.count(b"WATCHDOG=1") >= 2
