"""Schedule files that are not regular files (issue 9 §4): a named pipe, a socket, a symlink loop
or a dangling link is reported and skipped, never opened for reading (opening a FIFO blocks until a
writer comes, so the old loader hung forever). Every command reads schedules through
``spec.load_paths``; ``validate`` and ``next`` run as real subprocesses with a timeout, so a hang
fails the test instead of stalling the suite."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cronkeeper import clock
from cronkeeper.schedule import load_paths, load_valid

GOOD = '[ok]\ncron = "0 3 * * *"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.x"\nowner = "o"\n'


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("cronkeeper")), *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.fixture
def specials(tmp_path: Path) -> Path:
    (tmp_path / "good.toml").write_text(GOOD)
    os.mkfifo(tmp_path / "pipe.toml")
    (tmp_path / "loop1.toml").symlink_to("loop2.toml")
    (tmp_path / "loop2.toml").symlink_to("loop1.toml")
    (tmp_path / "dangling.toml").symlink_to("nowhere.toml")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.toml"))
    yield tmp_path
    sock.close()


def test_validate_directory_skips_each_special_file_with_a_warning(specials: Path) -> None:
    done = cli("validate", str(specials), "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["valid"] is True and report["schedules"] == 1
    kinds = {Path(w["file"]).name: w["message"] for w in report["warnings"]}
    assert kinds == {
        "pipe.toml": "a named pipe (FIFO), not a schedule file; skipped",
        "sock.toml": "a socket, not a schedule file; skipped",
        "loop1.toml": "a symlink loop, not a schedule file; skipped",
        "loop2.toml": "a symlink loop, not a schedule file; skipped",
        "dangling.toml": "a dangling symlink, not a schedule file; skipped",
    }


def test_validate_a_fifo_given_directly_is_an_error_not_a_hang(specials: Path) -> None:
    done = cli("validate", str(specials / "pipe.toml"), str(specials / "loop1.toml"))
    assert done.returncode == 1
    assert "pipe.toml: a named pipe (FIFO), not a schedule file" in done.stdout
    assert "loop1.toml: a symlink loop, not a schedule file" in done.stdout


def test_next_reads_past_a_fifo(specials: Path) -> None:
    done = cli("next", "ok", "--schedules", str(specials), "--after", "2026-01-01T00:00:00Z",
               "-n", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "2026-01-01T03:00:00Z" in done.stdout
    given = cli("next", "ok", "--schedules", str(specials / "pipe.toml"))
    assert given.returncode == 1 and "named pipe" in given.stderr


@pytest.mark.timeout(30)
def test_the_shared_loader_of_run_and_worker_skips_a_fifo(specials: Path) -> None:
    """`run` and `worker` load with load_valid: warnings do not stop them."""
    schedules = load_valid([specials], now=clock.wall())
    assert [s.name for s in schedules.specs] == ["ok"]
    result = load_paths([specials], now=clock.wall())
    assert result.files == (str(specials / "good.toml"),)  # the FIFO is not counted as a file
