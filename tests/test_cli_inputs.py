"""Inputs at the edge of the calendar get a usage message, not an internal error."""

from __future__ import annotations

import json

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


def _daily(tmp_path, zone: str) -> str:
    (tmp_path / "d.toml").write_text(
        f'[d]\ncron = "0 0 * * *"\ntimezone = "{zone}"\nmisfire = "skip"\ntask = "t.x"\n'
        'owner = "o"\n'
    )
    return str(tmp_path)


def test_next_accepts_exactly_the_range_it_computes(tmp_path):
    """Issue 9 §4: --after 9998-12-31T23:59:59Z was accepted, then exit 70 (year 10000); and
    nothing fired in 9998 although --after accepted it. Now the accepted range ends where fires
    are computed (9998-01-01T00:00Z): past it a usage error; just before it the last fires."""
    for zone in ("UTC", "Pacific/Kiritimati", "America/New_York", "Pacific/Pago_Pago"):
        schedules = _daily(tmp_path, zone)
        past = CliRunner().invoke(cli, ["next", "d", "--schedules", schedules,
                                        "--after", "9998-12-31T23:59:59Z"])
        assert past.exit_code == 2, (zone, past.output)
        assert "9998-01-01T00:00:00Z" in past.output and "internal error" not in past.output
        edge = CliRunner().invoke(cli, ["next", "d", "--schedules", schedules, "-n", "3",
                                        "--after", "9997-12-30T12:00:00Z", "--format", "json"])
        assert edge.exit_code == 0, (zone, edge.output)
        fires = json.loads(edge.stdout)["fires"]
        assert 1 <= len(fires) < 3, (zone, fires)
        assert all(f["utc"] < "9998-01-01T00:00:00Z" for f in fires)
        assert fires[-1]["local"].startswith(("9997-12-31", "9998-01-01")), (zone, fires)
        last = CliRunner().invoke(cli, ["next", "d", "--schedules", schedules,
                                        "--after", "9997-12-31T23:59:59Z"])
        assert last.exit_code == 0, (zone, last.output)
        assert "before 9998-01-01T00:00:00Z" in last.output


def test_the_trigger_api_answers_none_past_the_range():
    from datetime import UTC, datetime

    from cronkeeper.timing import make_trigger

    trigger = make_trigger(cron="0 0 * * *", every=None, timezone="Europe/Paris")
    late = datetime(9999, 6, 1, tzinfo=UTC)
    assert trigger.next_fire(late) is None
    assert list(trigger.fires(late, datetime(9999, 12, 31, tzinfo=UTC))) == []
