"""What ``cronkeeper run`` loads before it has a reason to: nothing of notify (smtplib,
urllib.request, http.client) without a notify config or heartbeat_url, and no
prometheus_client unless metrics are served (``--metrics-address off``). Each check imports in
a fresh interpreter, so that what other tests loaded does not hide a module-level import."""

from __future__ import annotations

import subprocess
import sys

# Loaded only when needed: a notify config (notify.*), a heartbeat_url (notify.heartbeat,
# notify.sinks), metrics served (cronkeeper.metrics, prometheus_client).
HEAVY = ("prometheus_client", "cronkeeper.metrics", "cronkeeper.notify.heartbeat",
         "cronkeeper.notify.sinks", "cronkeeper.notify.sender", "cronkeeper.notify.config",
         "smtplib", "urllib.request", "http.client", "http.server")


def loaded(code: str) -> list[str]:
    """Which of HEAVY a fresh interpreter has loaded after running ``code``."""
    script = f"{code}\nimport sys\nprint([m for m in {HEAVY!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return eval(proc.stdout.strip().splitlines()[-1])  # noqa: S307 - our own print of a list


def test_run_command_imports_no_notify_nor_metrics():
    assert loaded("import cronkeeper.cli.run") == []


def test_run_with_metrics_off_and_no_notify_config_loads_neither():
    """What ``cronkeeper run --metrics-address off`` does before it connects, without a
    notify config: no metrics, no config, no pinger, and the leader's loop made (not run)."""
    code = (
        "import cronkeeper.daemon\n"
        "from cronkeeper.cli import notify\n"
        "from cronkeeper.cli.common import start_metrics\n"
        "from cronkeeper.leading import LeaderLoop\n"
        "from cronkeeper.schedule.model import ScheduleSet\n"
        "assert start_metrics('off', 'scheduler', engine=None) is None\n"
        "assert notify.load(None, None) is None\n"
        "assert notify.pinger(None, 'i') is None\n"
        "LeaderLoop(ScheduleSet(()), metrics=None, pinger=None, audit_missing=False)\n"
    )
    assert loaded(code) == []


def test_a_heartbeat_url_loads_the_pinger_and_its_sinks(tmp_path):
    """The other way: with a heartbeat_url the pinger (and the sinks it sends with) is loaded
    when the daemon starts, not at the first tick: an import error shows at start."""
    config = tmp_path / "notify.toml"
    config.write_text('heartbeat_url = "http://127.0.0.1:9/ping"\n')
    code = (
        "from cronkeeper.cli import notify\n"
        f"found = notify.pinger(notify.load({str(config)!r}), 'i')\n"
        "assert type(found).__name__ == 'Pinger', found\n"
        "found.stop()\n"
    )
    got = loaded(code)
    assert "cronkeeper.notify.heartbeat" in got and "cronkeeper.notify.sinks" in got
