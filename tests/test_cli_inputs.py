"""Inputs at the edge of the calendar get a usage message, not an internal error."""

from __future__ import annotations

from click.testing import CliRunner

from cronkeeper.cli.main import cli


def test_next_after_year_one_is_a_usage_error(tmp_path):
    (tmp_path / "a.toml").write_text(
        '[x]\ncron = "0 * * * *"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.x"\nowner = "o"\n'
    )
    result = CliRunner().invoke(cli, ["next", "x", "--schedules", str(tmp_path),
                                      "--after", "0001-01-01T00:00:00+05:00"])
    assert result.exit_code == 2
    assert "out of range" in result.output


def test_history_since_before_year_one_is_a_usage_error(database_url, schema):
    result = CliRunner().invoke(cli, ["history", "--since", "99999999d", "--database-url",
                                      database_url, "--schema", schema])
    assert result.exit_code == 2, result.output
    assert "internal error" not in result.output and "Traceback" not in result.output
