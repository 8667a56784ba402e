"""The shipped Prometheus rules are valid and every alert behaves as its test says (§8).

promtool must be installed (`.ci/run` installs it: `apt-get install -y --no-install-recommends
prometheus`): these tests FAIL when it is missing, they never skip."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

RULES_DIR = Path(__file__).resolve().parent.parent / "prometheus"
RULES = RULES_DIR / "cronkeeper-rules.yml"
TESTS = RULES_DIR / "cronkeeper-rules.test.yml"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed: apt-get install -y --no-install-recommends "
                    "prometheus (Debian/Ubuntu) provides it", pytrace=False)
    return path


def alerts() -> list[str]:
    return re.findall(r"^\s*- alert:\s*(\w+)", RULES.read_text(), flags=re.M)


def test_promtool_check_rules():
    proc = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_promtool_test_rules():
    proc = subprocess.run([promtool(), "test", "rules", TESTS.name], capture_output=True,
                          text=True, cwd=RULES_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_test():
    text = TESTS.read_text()
    firing = set()
    for block in re.split(r"\n\s*- eval_time:", text)[1:]:
        name = re.search(r"alertname:\s*(\w+)", block).group(1)
        if "exp_labels" in block:
            firing.add(name)
    assert set(alerts()) <= firing, f"alerts without a firing test: {set(alerts()) - firing}"


def test_required_alerts_exist_and_name_the_owner():
    names = set(alerts())
    assert {
        "CronkeeperOldestJobTooOld", "CronkeeperDeadLetters", "CronkeeperNoLeader",
        "CronkeeperPeriodsMissing", "CronkeeperPeriodsSkippedMisfire",
        "CronkeeperScheduleDigestDisagreement", "CronkeeperWorkersIdleWhileJobsWait",
        "CronkeeperRetryStorm", "CronkeeperRuntimeNearTimeout", "CronkeeperNotificationsFailed",
    } <= names
    text = RULES.read_text()
    assert "cronkeeper_outbox_jobs" not in text.split("CronkeeperOldestJobTooOld")[1].split(
        "- alert:")[0], "alert on age, not depth"
    for block in text.split("- alert:")[1:]:
        if "{{ $labels.schedule }}" in block:
            assert "{{ $labels.owner }}" in block, block.split("\n")[0]
    storm = text.split("alert: CronkeeperRetryStorm")[1]
    assert "Adding workers makes it worse" in storm


def test_rules_ship_in_the_package():
    import cronkeeper.prometheus as pkg

    assert (Path(pkg.__file__).parent / "cronkeeper-rules.yml").exists()
