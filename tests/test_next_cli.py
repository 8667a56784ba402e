"""`cronkeeper next` (SPEC §4): fires local and UTC, JSON shape, errors and exit codes."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli

SCHEDULE = """\
[{name}]
cron = "{cron}"
timezone = "America/New_York"
misfire = "skip"
task = "t.x"
owner = "me"
"""


@pytest.fixture
def schedules(tmp_path: pathlib.Path) -> pathlib.Path:
    text = SCHEDULE.format(name="nightly", cron="30 1 * * *")
    text += "\n" + SCHEDULE.format(name="early", cron="30 2 * * *")
    (tmp_path / "jobs.toml").write_text(text)
    return tmp_path


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["next", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_table_fold(schedules: pathlib.Path) -> None:
    code, out, _ = run(
        "nightly", "--schedules", str(schedules), "--after", "2026-10-31T00:00Z", "-n", "3"
    )
    assert code == 0
    assert out.splitlines() == [
        "2026-10-31T01:30:00-04:00  EDT  2026-10-31T05:30:00Z",
        "2026-11-01T01:30:00-04:00  EDT  2026-11-01T05:30:00Z",
        "2026-11-02T01:30:00-05:00  EST  2026-11-02T06:30:00Z",
    ]


def test_json_gap(schedules: pathlib.Path) -> None:
    code, out, _ = run(
        "early",
        "--schedules",
        str(schedules),
        "--after",
        "2026-03-08T00:00:00+00:00",
        "-n",
        "2",
        "--format",
        "json",
    )
    assert code == 0
    assert json.loads(out) == {
        "schedule": "early",
        "timezone": "America/New_York",
        "fires": [
            {"utc": "2026-03-08T07:00:00Z", "local": "2026-03-08T03:00:00-04:00"},
            {"utc": "2026-03-09T06:30:00Z", "local": "2026-03-09T02:30:00-04:00"},
        ],
    }


def test_default_count_is_five(schedules: pathlib.Path) -> None:
    code, out, _ = run("nightly", "--schedules", str(schedules), "--format", "json")
    assert code == 0
    assert len(json.loads(out)["fires"]) == 5


def test_unknown_name_suggests(schedules: pathlib.Path) -> None:
    code, out, err = run("nightyl", "--schedules", str(schedules))
    assert code == 1 and out == ""
    assert "no schedule named 'nightyl'" in err and "did you mean 'nightly'?" in err


@pytest.mark.parametrize(
    ("after", "message"),
    [
        ("2026-10-31T00:00", "has no offset"),
        ("garbage", "is not an ISO 8601 instant"),
        ("2026-13-01T00:00Z", "is not an ISO 8601 instant"),
    ],
)
def test_bad_after_is_a_usage_error(schedules: pathlib.Path, after: str, message: str) -> None:
    code, _, err = run("nightly", "--schedules", str(schedules), "--after", after)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_invalid_schedules_print_errors(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad.toml").write_text(SCHEDULE.format(name="bad", cron="0 25 * * *"))
    code, out, err = run("bad", "--schedules", str(tmp_path))
    assert code == 1 and out == ""
    assert "bad.toml:" in err and "schedule 'bad'" in err and "hour field: 25" in err


def test_control_characters_are_escaped(schedules: pathlib.Path) -> None:
    code, _, err = run("\x1b[31mred", "--schedules", str(schedules))
    assert code == 1
    assert "\x1b" not in err and "\\x1b[31mred" in err


def test_real_subprocess(schedules: pathlib.Path) -> None:
    script = pathlib.Path(sys.executable).with_name("cronkeeper")
    proc = subprocess.run(
        [
            str(script),
            "next",
            "nightly",
            "--schedules",
            str(schedules),
            "--after",
            "2026-10-31T00:00Z",
            "-n",
            "3",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [f["utc"] for f in json.loads(proc.stdout)["fires"]] == [
        "2026-10-31T05:30:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
    ]
