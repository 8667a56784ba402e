"""Numbers and steps a cron field cannot use (issue 9 §4): bounded before int(), refused or
warned about, and never an internal error that takes the other schedules down with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli
from cronkeeper.timing import TimingError, parse_cron

NINES_5000 = "9" * 5000


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("*/99999999999999999999 * * * *", "minute field: step 999999...(20 digits) is too large"),
        (f"*/{NINES_5000} * * * *", "(5000 digits) is too large"),
        (f"0 {NINES_5000} * * *", "hour field: value 999999...(5000 digits) is too large"),
        ("0 0 1-" + NINES_5000 + " * *", "day-of-month field: value"),
        ("*/61 * * * *", "step 61 in '*/61' is larger than any cron field"),
        ("0 0 * */100 *", "month field: step 100"),
        ("*/5 */99 * * * *", "minute field: step 99"),  # 6 fields: seconds first
    ],
)
def test_numbers_beyond_any_field_are_errors(expr: str, message: str) -> None:
    with pytest.raises(TimingError, match=None) as caught:
        parse_cron(expr)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("expr", "warning"),
    [
        ("*/60 * * * *", "minute field: step 60 in '*/60' is past its range (0-59): only 0 fires"),
        ("0 */24 * * *", "hour field: step 24 in '*/24' is past its range (0-23): only 0 fires"),
        ("0 0 */31 * *", "day-of-month field: step 31"),
        ("0 0 1 */12 *", "month field: step 12"),
        ("0-10/15 * * * *", "minute field: step 15 in '0-10/15' is past its range (0-10): only 0 fires"),
    ],
)
def test_a_step_that_never_steps_is_a_warning(expr: str, warning: str) -> None:
    parsed = parse_cron(expr)
    assert len(parsed.warnings) == 1 and parsed.warnings[0].startswith(warning)


@pytest.mark.parametrize("expr", ["*/30 * * * *", "0 */12 * * *", "0 0 */15 * *", "1-5/4 * * * *",
                                  "* * * * 1-5/2", "5-5 * * * *", "30 2 * * *"])
def test_steps_that_step_are_silent(expr: str) -> None:
    assert parse_cron(expr).warnings == ()


def _schedule(name: str, cron: str) -> str:
    return (f'[{name}]\ncron = "{cron}"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.x"\n'
            'owner = "o"\n\n')  # fmt: skip


def test_validate_reports_each_bad_schedule_and_keeps_checking_the_rest(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(
        _schedule("huge", f"*/{NINES_5000} * * * *") + _schedule("good", "0 3 * * *")
    )
    (tmp_path / "b.toml").write_text(
        _schedule("sixty-one", "*/61 * * * *") + _schedule("sixty", "*/60 * * * *")
        + _schedule("also-good", "15 * * * *")
    )
    result = CliRunner().invoke(cli, ["validate", str(tmp_path), "--format", "json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["schedules"] == 5
    assert sorted(e["schedule"] for e in report["errors"]) == ["huge", "sixty-one"]
    assert [w["schedule"] for w in report["warnings"]] == ["sixty"]
    assert "internal error" not in result.output


def test_next_with_a_huge_number_is_a_clear_error_not_exit_70(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(_schedule("huge", f"*/{NINES_5000} * * * *"))
    result = CliRunner().invoke(cli, ["next", "huge", "--schedules", str(tmp_path)])
    assert result.exit_code == 1
    assert "too large" in result.stderr and "internal error" not in result.stderr
