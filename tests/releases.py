"""Earlier releases of cronkeeper, built from this repository's own git history, for the tests
that run them beside the code under test (tests/test_rolling_upgrade.py).

A release is exported with ``git archive`` at its commit and installed into a virtual
environment of its own, cached under ``$CRONKEEPER_RELEASE_CACHE`` (default
``~/.cache/cronkeeper-tests``) so that only the first run pays for the install. A checkout
without that commit (a shallow clone) fails the test, saying how to fetch it; it never skips.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# SPEC §18 / CHANGELOG.md: each release and the commit it was made from.
RELEASES = {"0.1.0": "aa4f6a26f9e775fababa0703def9f81f76268294"}
REPO = Path(__file__).resolve().parent.parent


def _cache_root() -> Path:
    configured = os.environ.get("CRONKEEPER_RELEASE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "cronkeeper-tests"


def _run(argv: list[str], *, timeout: float, what: str, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, timeout=timeout, **kwargs)
    if result.returncode != 0:
        err = result.stderr.decode(errors="replace") if isinstance(result.stderr, bytes) else result.stderr
        pytest.fail(f"{what} failed ({result.returncode}): {err.strip()[-2000:]}", pytrace=False)
    return result


def release_bin(version: str) -> Path:
    """The ``cronkeeper`` console script of release ``version``, installed if it is not yet."""
    commit = RELEASES[version]
    home = _cache_root() / f"release-{version}-{commit[:12]}"
    script = home / "venv" / "bin" / "cronkeeper"
    if (home / "ready").exists() and script.exists():
        return script
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time, across test processes
        if (home / "ready").exists() and script.exists():
            return script
        if shutil.which("git") is None:
            pytest.fail(f"building cronkeeper {version} for the upgrade test needs git", pytrace=False)
        found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                               capture_output=True, timeout=30)
        if found.returncode != 0:
            pytest.fail(
                f"the upgrade test builds cronkeeper {version} from this repository's history, "
                f"but commit {commit[:12]} is not in {REPO} (a shallow clone?): run "
                "`git fetch --unshallow` (or clone without --depth)", pytrace=False)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(home)
        src = home / "src"
        src.mkdir(parents=True)
        archive = _run(["git", "-C", str(REPO), "archive", "--format=tar", commit], timeout=120,
                       what=f"git archive {commit[:12]}")
        _run(["tar", "-x", "-C", str(src)], input=archive.stdout, timeout=120, what="tar -x")
        _run([sys.executable, "-m", "venv", str(home / "venv")], timeout=300,
             what="creating the release's virtual environment")
        _run([str(home / "venv" / "bin" / "pip"), "install", "-q", str(src)], timeout=900,
             what=f"installing cronkeeper {version}")
        version_out = _run([str(script), "--version"], timeout=60, what="cronkeeper --version",
                           text=True).stdout
        if version not in version_out:
            pytest.fail(f"the build of {commit[:12]} says {version_out.strip()!r}, not {version}",
                        pytrace=False)
        (home / "ready").write_text(commit + "\n")
    return script
