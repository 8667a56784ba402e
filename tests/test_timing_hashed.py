"""H (issue 25): the documented hash pinned to known values, what each form resolves to, its
errors, how it spreads, and the name threaded through validate, next and the triggers."""

from __future__ import annotations

import collections
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli
from cronkeeper.schedule import ScheduleSpec
from cronkeeper.schedule.model import Misfire
from cronkeeper.timing import TimingError, field_hash, make_trigger, parse_cron, resolve, uses_hash

# The hash is part of the product: these values may never change (a schedule's instants would
# move on upgrade). SHA-256 of "NAME FIELD", first 8 bytes big-endian.
PINNED = [
    ("nightly-invoices", "second", 12221653302981770235),
    ("nightly-invoices", "minute", 16418342745008709675),
    ("nightly-invoices", "hour", 7456065238028938577),
    ("nightly-invoices", "day-of-month", 5598353600642684704),
    ("nightly-invoices", "month", 1114976789529837763),
    ("nightly-invoices", "day-of-week", 8156906131498225876),
    ("tenant-0042", "minute", 12571788100293126109),
    ("tenant-0042", "hour", 18232840595832610701),
    ("a", "minute", 16288121791652459885),
]


@pytest.mark.parametrize(("name", "field", "value"), PINNED)
def test_the_hash_is_pinned(name: str, field: str, value: int) -> None:
    assert field_hash(name, field) == value


@pytest.mark.parametrize(
    ("expr", "nightly", "tenant"),
    [
        ("H 6 * * *", "15 6 * * *", "49 6 * * *"),
        ("H H * * *", "15 17 * * *", "49 21 * * *"),
        ("h 6 * * *", "15 6 * * *", "49 6 * * *"),  # letters in any case
        ("H/15 * * * *", "0-59/15 * * * *", "4-59/15 * * * *"),
        ("H(0-29)/10 H(9-17) * * mon-fri", "5-29/10 14 * * mon-fri", "9-29/10 12 * * mon-fri"),
        ("H H H H H", "15 17 5 8 5", "49 21 15 4 3"),  # day 1-28, weekday 0-6
        ("H H H * * H", "15 15 17 * * 5", "11 49 21 * * 3"),  # six fields: second first
        ("H(0-29),H(30-59) * * * *", "15,45 * * * *", "19,49 * * * *"),  # one hash per field
        ("0 0 * * H(fri-sun)", "0 0 * * 6", "0 0 * * 5"),  # names; a range may end on Sunday
        ("H/60 * * * *", "15 * * * *", "49 * * * *"),  # one value: written alone
        ("H(0-5)/5 * * * *", "0-5/5 * * * *", "4 * * * *"),
        ("H/1 0 * * *", "0-59/1 0 * * *", "0-59/1 0 * * *"),  # every value
        ("30 2 L * 5L", "30 2 L * 5L", "30 2 L * 5L"),  # no H: unchanged
    ],
)
def test_what_each_form_resolves_to(expr: str, nightly: str, tenant: str) -> None:
    assert resolve(expr, "nightly-invoices") == nightly
    assert resolve(expr, "tenant-0042") == tenant


def test_a_resolved_expression_is_the_plain_grammar_and_classified_as_written() -> None:
    e = parse_cron("H H * * *", "nightly-invoices")
    assert (e.minutes, e.hours, e.fixed_time, e.source) == ((15,), (17,), True, "15 17 * * *")
    assert not parse_cron("H * * * *", "x").fixed_time  # the hour field starts with '*'
    assert parse_cron("H/15 H * * *", "x").fixed_time  # a hashed value is a fixed value
    assert parse_cron("0 0 H * 1", "x").day_or  # a hashed day is a restricted field
    assert not parse_cron("*/5 H * * *", "x").fixed_time


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("H(5-3) * * * *", "minute field: range in 'H(5-3)' is reversed (5 > 3)"),
        ("H(0-99) * * * *", "minute field: 99 is out of range 0-59"),
        ("0 H(0-24) * * *", "hour field: 24 is out of range 0-23"),
        ("H/0 * * * *", "minute field: step in 'H/0' is zero"),
        ("H/61 * * * *", "minute field: step 61 in 'H/61' is larger than any cron field"),
        ("H(0-9)/20 * * * *", "minute field: step 20 in 'H(0-9)/20' is larger than its range 0-9"),
        ("0 0 H/29 * *", "day-of-month field: step 29 in 'H/29' is larger than its range 1-28"),
        ("HL * * * *", "minute field: 'HL' is not a hashed value"),
        ("H5 * * * *", "minute field: 'H5' is not a hashed value"),
        ("H-5 * * * *", "minute field: 'H-5' is not a hashed value"),
        ("H() * * * *", "minute field: 'H()': H(...) takes a range a-b"),
        ("H(5) * * * *", "minute field: 'H(5)': H(...) takes a range a-b"),
        ("H(1-2-3) * * * *", "minute field: 'H(1-2-3)': H(...) takes a range a-b"),
        ("H(a-b) * * * *", "minute field: 'a' is not a number"),
        ("H/x * * * *", "minute field: step 'x' in 'H/x' is not a number"),
        ("1-H * * * *", "minute field: 'H': H stands for a whole item"),
        ("0 0 * * H#2", "day-of-week field: 'H#2' is not a hashed value"),
        ("0 0 * * HL", "day-of-week field: 'HL' is not a hashed value"),
        ("H(\uff10-5) * * * *", "minute field: character '\uff10' (U+FF10) is not allowed"),
        ("H(0-5)\u00a0* * * *", "cron expression: character '\\xa0' (U+00A0) is not allowed"),
    ],
)
def test_malformed_h_is_an_error_naming_its_field(expr: str, message: str) -> None:
    with pytest.raises(TimingError) as info:
        parse_cron(expr, "s")
    assert str(info.value).startswith(message), str(info.value)


def test_h_without_a_name_is_an_error_not_a_guess() -> None:
    with pytest.raises(TimingError, match="H needs the schedule's name"):
        parse_cron("H 6 * * *")
    with pytest.raises(TimingError, match="H needs the schedule's name"):
        make_trigger(cron="H 6 * * *", every=None, timezone="UTC")


def test_uses_hash_looks_at_items_only() -> None:
    assert uses_hash("H 6 * * *") and uses_hash("0 h * * *") and uses_hash("0,H(1-2) 0 * * *")
    assert not uses_hash("0 6 * * thu") and not uses_hash("@hourly") and not uses_hash("0 0 L * *")


def test_h_spreads_a_thousand_names_over_the_hour() -> None:
    """``H 6 * * *`` for 1,000 names: every minute of the hour taken, none by more than 3% of
    them (a uniform spread puts 16.7 in each)."""
    minutes = collections.Counter(
        parse_cron("H 6 * * *", f"tenant-{i:04d}").minutes[0] for i in range(1000)
    )
    assert len(minutes) == 60 and max(minutes.values()) <= 30 and min(minutes.values()) >= 5


def test_schedules_share_a_trigger_per_resolved_value() -> None:
    """The leader's per-trigger sharing holds: 1,000 ``H 6`` schedules make at most 60 triggers."""
    triggers = {id(make_trigger(cron="H 6 * * *", every=None, timezone="UTC", name=f"t-{i}"))
                for i in range(1000)}  # fmt: skip
    assert len(triggers) <= 60


def test_the_spec_resolves_by_its_name_and_stores_the_text() -> None:
    spec = ScheduleSpec(name="nightly-invoices", timezone="UTC", misfire=Misfire.SKIP,
                        cron="H H * * *", task="t")  # fmt: skip
    assert spec.to_json()["cron"] == "H H * * *" and spec.resolved_cron == "15 17 * * *"
    again = ScheduleSpec.from_json(json.loads(spec.canonical_text()))
    after = datetime(2026, 5, 1, tzinfo=UTC)
    assert again.trigger().next_fire(after) == datetime(2026, 5, 1, 17, 15, tzinfo=UTC)
    assert spec.renamed("tenant-0042", "t", None, "", 0).trigger().next_fire(after) == datetime(
        2026, 5, 1, 21, 49, tzinfo=UTC)


SCHEDULE = """\
[{name}]
cron = "{cron}"
timezone = "{zone}"
misfire = "skip"
task = "t.x"
owner = "me"
"""


def write(directory: Path, *schedules: tuple[str, str, str]) -> Path:
    text = "\n".join(SCHEDULE.format(name=n, cron=c, zone=z) for n, c, z in schedules)
    (directory / "jobs.toml").write_text(text)
    return directory


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_next_shows_the_hashed_instants(tmp_path: Path) -> None:
    write(tmp_path, ("nightly-invoices", "H 2 * * *", "America/New_York"))
    code, out = invoke("next", "nightly-invoices", "--schedules", str(tmp_path), "--after",
                       "2026-03-07T00:00Z", "-n", "3")  # fmt: skip
    assert code == 0
    assert out.splitlines() == [
        "# cron 'H 2 * * *' is '15 2 * * *' for 'nightly-invoices' (H hashes the name)",
        "2026-03-07T02:15:00-05:00  EST  2026-03-07T07:15:00Z",
        "2026-03-08T03:00:00-04:00  EDT  2026-03-08T07:00:00Z",  # 02:15 is in the gap
        "2026-03-09T02:15:00-04:00  EDT  2026-03-09T06:15:00Z",
    ]
    code, out = invoke("next", "nightly-invoices", "--schedules", str(tmp_path), "--after",
                       "2026-03-07T00:00Z", "-n", "1", "--format", "json")  # fmt: skip
    assert json.loads(out) == {
        "schedule": "nightly-invoices", "timezone": "America/New_York",
        "fires": [{"utc": "2026-03-07T07:15:00Z", "local": "2026-03-07T02:15:00-05:00"}],
        "cron": "H 2 * * *", "resolved_cron": "15 2 * * *",
    }  # fmt: skip


def test_validate_warns_of_a_hashed_time_in_a_dst_gap_per_name(tmp_path: Path) -> None:
    """Two tables that differ only in their names: each warning names its own hashed minute
    (the load's memo of valid tables must not hand one name's findings to the other)."""
    write(tmp_path, ("nightly-invoices", "H 2 * * *", "America/New_York"),
          ("tenant-0042", "H 2 * * *", "America/New_York"),
          ("plain", "H 12 * * *", "America/New_York"))  # fmt: skip
    code, out = invoke("validate", str(tmp_path), "--format", "json")
    assert code == 0
    warnings = {w["schedule"]: w["message"] for w in json.loads(out)["warnings"]}
    assert set(warnings) == {"nightly-invoices", "tenant-0042"}  # 12:xx is never in a gap
    assert " 02:15 does not exist in America/New_York (DST gap)" in warnings["nightly-invoices"]
    assert " 02:49 does not exist in America/New_York (DST gap)" in warnings["tenant-0042"]


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("H(0-99) 6 * * *", 'cron "H(0-99) 6 * * *": minute field: 99 is out of range 0-59'),
        ("0 0 H(30-31) 2 *", 'cron "0 0 H(30-31) 2 *" (for this schedule: "0 0 30 2 *") can never '
                             "fire (no date matches it)"),
        ("H 25 * * *", 'cron "H 25 * * *" (for this schedule: "15 25 * * *"): hour field: 25 is out of '
                       "range 0-23"),
    ],
)
def test_validate_reports_h_errors_at_their_line(tmp_path: Path, cron: str, message: str) -> None:
    write(tmp_path, ("nightly-invoices", cron, "UTC"))
    code, out = invoke("validate", str(tmp_path), "--format", "json")
    assert code == 1 and "Traceback" not in out
    (error,) = json.loads(out)["errors"]
    assert (error["line"], error["message"]) == (2, message)
