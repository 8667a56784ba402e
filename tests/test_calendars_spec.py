"""Calendars in schedule files (issue 25 item 3; docs/schedules.md, "Calendars"): what
validate reports, with file and line, what the loaded specs and their stored JSON hold, and how
`cronkeeper next` shows the periods a calendar skips and the fires it moves."""

from __future__ import annotations

import json
import os
import pathlib
from datetime import UTC, date, datetime

import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli
from cronkeeper.schedule import load_paths
from cronkeeper.schedule.model import OnCalendar, ScheduleSpec, canonical_json
from cronkeeper.timing.calendars import Calendar

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)

SCHEDULE = """\
[{name}]
cron = "{cron}"
timezone = "America/New_York"
misfire = "skip"
task = "t.x"
owner = "me"
"""

CALENDAR = """\
[calendars.us-holidays]
dates = ["2026-12-25", "2026-07-03", "2027-01-01", 2026-11-26]
"""

ICS = """\
BEGIN:VCALENDAR
VERSION:2.0
PRODID:-//cronkeeper tests//EN
BEGIN:VEVENT
UID:christmas
DTSTART;VALUE=DATE:20261224
DTEND;VALUE=DATE:20261227
SUMMARY:Christmas, three days
END:VEVENT
BEGIN:VEVENT
UID:new-year
DTSTART;VALUE=DATE:20260101
RRULE:FREQ=YEARLY
EXDATE;VALUE=DATE:20270101
SUMMARY:New year, every year but 2027
END:VEVENT
BEGIN:VEVENT
UID:cancelled
DTSTART;VALUE=DATE:20260601
STATUS:CANCELLED
SUMMARY:Called off
END:VEVENT
BEGIN:VEVENT
UID:meeting
DTSTART:20260301T100000Z
DTEND:20260301T110000Z
SUMMARY:A meeting, not a day off
END:VEVENT
END:VCALENDAR
"""


def write(directory: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = directory / name
    path.write_text(text)
    return path


def schedule(name: str = "nightly", cron: str = "30 9 * * *", **extra: str) -> str:
    return SCHEDULE.format(name=name, cron=cron) + "".join(
        f'{key} = "{value}"\n' for key, value in extra.items())


def problems(result) -> list[str]:
    return [d.render() for d in result.errors + result.warnings]


def test_a_calendar_in_another_file_is_resolved_with_its_dates(tmp_path):
    write(tmp_path, "calendars.toml", CALENDAR)
    write(tmp_path, "jobs.toml", schedule(calendar="us-holidays", on_calendar="next_day")
          + "\n" + schedule("plain"))
    result = load_paths([tmp_path], now=NOW)
    assert problems(result) == []
    specs = result.schedules.by_name()
    spec = specs["nightly"]
    assert spec.calendar is not None and spec.calendar.name == "us-holidays"
    assert spec.calendar.dates() == [date(2026, 7, 3), date(2026, 11, 26), date(2026, 12, 25),
                                     date(2027, 1, 1)]  # strings and TOML dates, sorted
    assert spec.on_calendar is OnCalendar.NEXT_DAY
    assert specs["plain"].calendar is None
    assert result.defined == 2  # calendars are not schedules


def test_the_stored_spec_carries_the_dates_and_round_trips(tmp_path):
    write(tmp_path, "a.toml", CALENDAR + "\n" + schedule(calendar="us-holidays"))
    spec = load_paths([tmp_path], now=NOW).schedules.by_name()["nightly"]
    data = json.loads(spec.canonical_text())
    assert data["calendar"] == {"name": "us-holidays", "dates": [
        "2026-07-03", "2026-11-26", "2026-12-25", "2027-01-01"]}
    assert data["on_calendar"] == "skip"
    assert spec.canonical_text() == canonical_json(spec.to_json())
    again = ScheduleSpec.from_json(data)
    assert again == spec and again.digest == spec.digest
    assert again.calendar is spec.calendar  # one shared object per distinct calendar


def test_a_spec_without_a_calendar_keeps_the_json_and_digest_it_had(tmp_path):
    """No calendar, no calendar keys: every existing schedule keeps its digest, so upgrading
    makes no new version of it. The digest is pinned, as a stored one would be."""
    write(tmp_path, "a.toml", schedule())
    spec = load_paths([tmp_path], now=NOW).schedules.by_name()["nightly"]
    assert "calendar" not in spec.to_json() and "on_calendar" not in spec.to_json()
    before = ScheduleSpec("nightly", "America/New_York", spec.misfire, cron="30 9 * * *",
                          task="t.x", owner="me")
    assert spec.canonical_text() == before.canonical_text()


def test_a_change_of_dates_is_a_new_digest_and_the_old_one_keeps_its_dates(tmp_path):
    write(tmp_path, "cal.toml", CALENDAR)
    write(tmp_path, "a.toml", schedule(calendar="us-holidays"))
    old = load_paths([tmp_path], now=NOW).schedules.by_name()["nightly"]
    write(tmp_path, "cal.toml", CALENDAR.replace('"2026-07-03", ', ""))
    new = load_paths([tmp_path], now=NOW).schedules.by_name()["nightly"]
    assert old.digest != new.digest
    assert date(2026, 7, 3) in old.calendar.dates() and date(2026, 7, 3) not in new.calendar.dates()
    stored = ScheduleSpec.from_json(json.loads(old.canonical_text()))
    assert date(2026, 7, 3) in stored.calendar.dates()  # what an audit of the old version reads


def test_ics_all_day_events_multi_day_recurring_cancelled_and_timed(tmp_path):
    write(tmp_path, "holidays.ics", ICS)
    write(tmp_path, "a.toml", '[calendars.office]\nics = "holidays.ics"\ndates = ["2026-05-01"]\n'
          + "\n" + schedule(calendar="office"))
    result = load_paths([tmp_path], now=NOW)
    assert result.errors == []
    assert [d.render() for d in result.warnings] == [
        f"{tmp_path / 'a.toml'}:2: calendar 'office': ics 'holidays.ics': 1 event with a time "
        "of day left out (a calendar lists whole days: all-day events only)"]
    cal = result.schedules.by_name()["nightly"].calendar
    assert cal.dates() == [
        date(2026, 1, 1), date(2026, 5, 1),  # the recurring event's first year; the dates key
        date(2026, 12, 24), date(2026, 12, 25), date(2026, 12, 26),  # DTEND is exclusive
        date(2028, 1, 1),  # 2027 excluded (EXDATE); expanded over 2026-2028 (three years)
    ]


def test_ics_path_is_relative_to_the_file_that_names_it(tmp_path):
    sub = tmp_path / "team"
    sub.mkdir()
    write(sub, "holidays.ics", ICS)
    write(sub, "a.toml", '[calendars.office]\nics = "holidays.ics"\n\n' + schedule(calendar="office"))
    assert load_paths([tmp_path], now=NOW).errors == []
    write(tmp_path, "b.toml", f'[calendars.abs]\nics = "{sub / "holidays.ics"}"\n')
    assert load_paths([tmp_path], now=NOW).errors == []


@pytest.mark.parametrize(("calendar", "line", "words"), [
    ('dates = ["2026-02-30"]', 2, "dates[0] is \"2026-02-30\", not a date: write \"YYYY-MM-DD\""),
    ('dates = ["2026-12-25", "26-12-25", 5]', 2, "dates[1] is \"26-12-25\", not a date"),
    ('dates = "2026-12-25"', 2, "'dates' must be an array of dates"),
    ('dates = [2026-12-25T10:00:00]', 2, "dates[0] is "),
    ('dats = ["2026-12-25"]', 2, "unknown key 'dats'; did you mean 'dates'?"),
    ("", 1, "neither 'dates' nor 'ics' is set"),
    ('ics = "missing.ics"', 2, "ics 'missing.ics': cannot read file: No such file or directory"),
    ('ics = "not.ics"', 2, "ics 'not.ics': not a valid iCalendar file"),
    ('ics = "broken.ics"', 2, "ics 'broken.ics': not a valid iCalendar file"),
    ('ics = "event.ics"', 2, "ics 'event.ics': not an iCalendar file (no VCALENDAR)"),
    ("ics = 3", 2, "'ics' must be the path of an iCalendar file, not an integer"),
])
def test_calendar_errors_name_the_file_and_line(tmp_path, calendar, line, words):
    write(tmp_path, "not.ics", "this is not iCalendar\n")
    write(tmp_path, "broken.ics", ICS.replace("DTSTART;VALUE=DATE:20261224",
                                              "DTSTART;VALUE=DATE:20261332"))
    write(tmp_path, "event.ics", "BEGIN:VEVENT\nUID:x\nDTSTART;VALUE=DATE:20260101\nEND:VEVENT\n")
    write(tmp_path, "a.toml", f"[calendars.office]\n{calendar}\n\n" + schedule(calendar="office"))
    result = load_paths([tmp_path], now=NOW)
    found = [d for d in result.errors if words in d.message]
    assert len(found) == 1, problems(result)
    assert found[0].line == line and words in found[0].message, found[0].render()
    assert found[0].render().startswith(f"{tmp_path / 'a.toml'}:{line}: calendar 'office': ")
    assert result.schedules.specs == ()  # a schedule naming a broken calendar is not loaded


def test_an_ics_that_is_a_fifo_is_never_opened_for_reading(tmp_path):
    os.mkfifo(tmp_path / "pipe.ics")
    write(tmp_path, "a.toml", '[calendars.office]\nics = "pipe.ics"\n')
    (error,) = load_paths([tmp_path], now=NOW).errors
    assert error.message == "calendar 'office': ics 'pipe.ics': not a regular file"


def test_unknown_calendar_with_did_you_mean_and_every_other_problem_at_once(tmp_path):
    write(tmp_path, "cal.toml", CALENDAR)
    write(tmp_path, "a.toml", schedule(calendar="us-holiday") + "max_attempts = 0\n"
          + "\n" + schedule("other", calendar="nowhere"))
    result = load_paths([tmp_path], now=NOW)
    assert problems(result) == [
        f"{tmp_path / 'a.toml'}:7: schedule 'nightly': unknown calendar 'us-holiday'; did you "
        "mean 'us-holidays'?",
        f"{tmp_path / 'a.toml'}:8: schedule 'nightly': 'max_attempts' must be between 1 and 1000, got 0",
        f"{tmp_path / 'a.toml'}:16: schedule 'other': unknown calendar 'nowhere'; define it as "
        "[calendars.nowhere] in a schedule file",
    ]


@pytest.mark.parametrize(("extra", "words"), [
    ({"on_calendar": "next_day"}, "'on_calendar' applies only with 'calendar'"),
    ({"calendar": "us-holidays", "on_calendar": "next-day"},
     "'on_calendar' must be one of skip, next_day, not \"next-day\"; did you mean 'next_day'?"),
    ({"calendar": "US Holidays"}, "'calendar' \"US Holidays\" is not a calendar name"),
])
def test_schedule_calendar_keys_are_checked(tmp_path, extra, words):
    text = CALENDAR + "\n" + schedule(**extra)
    write(tmp_path, "a.toml", text)
    (error,) = load_paths([tmp_path], now=NOW).errors
    assert words in error.message and error.schedule == "nightly"
    key = error.message.split("'")[1]  # the key's own line
    assert error.line == 1 + next(i for i, line in enumerate(text.splitlines())
                                  if line.startswith(f"{key} ="))


def test_a_calendar_without_dates_used_by_a_schedule_is_an_error_at_the_schedule(tmp_path):
    write(tmp_path, "a.toml", "[calendars.empty]\ndates = []\n\n"
          + schedule(calendar="empty", on_calendar="next_day"))
    (error,) = load_paths([tmp_path], now=NOW).errors
    assert error.render() == (
        f"{tmp_path / 'a.toml'}:10: schedule 'nightly': calendar 'empty' ({tmp_path / 'a.toml'}:1)"
        " lists no dates, so it would skip nothing: give it dates, or remove 'calendar' and "
        "'on_calendar'")


def test_the_same_calendar_in_two_files_is_an_error_at_both(tmp_path):
    write(tmp_path, "a.toml", CALENDAR)
    write(tmp_path, "b.toml", "\n" + CALENDAR + "\n" + schedule(calendar="us-holidays"))
    result = load_paths([tmp_path], now=NOW)
    assert problems(result) == [
        f"{tmp_path / 'a.toml'}:1: calendar 'us-holidays': defined twice: also at "
        f"{tmp_path / 'b.toml'}:2",
        f"{tmp_path / 'b.toml'}:2: calendar 'us-holidays': defined twice: also at "
        f"{tmp_path / 'a.toml'}:1",
    ]
    assert result.schedules.specs == ()


def test_calendars_share_no_namespace_with_schedules(tmp_path):
    """A calendar and a schedule may have one name; the table 'calendars' holds calendars."""
    write(tmp_path, "a.toml", "[calendars.nightly]\ndates = [\"2026-12-25\"]\n\n"
          + schedule(calendar="nightly"))
    result = load_paths([tmp_path], now=NOW)
    assert result.errors == [] and set(result.schedules.by_name()) == {"nightly"}
    write(tmp_path, "a.toml", "calendars = 3\n")
    (error,) = load_paths([tmp_path], now=NOW).errors
    assert error.line == 1 and "'calendars' holds calendars" in error.message
    assert "a schedule cannot be named 'calendars'" in error.message
    write(tmp_path, "a.toml", schedule("calendars"))
    errors = load_paths([tmp_path], now=NOW).errors
    assert errors[0].message.startswith("calendar 'cron': must be a table")
    assert all("schedules are not defined under [calendars]" in e.message for e in errors)


@pytest.mark.parametrize(("last", "warned"), [
    ("2026-01-15", "its last date is 2026-01-15 (0 days from now)"),
    ("2026-02-13", "its last date is 2026-02-13 (29 days from now)"),
    ("2026-02-14", None),
    ("2025-12-25", "its last date is 2025-12-25 (21 days ago)"),
])
def test_a_calendar_ending_within_30_days_is_a_warning(tmp_path, last, warned):
    write(tmp_path, "a.toml", f'[calendars.soon]\ndates = ["2025-01-01", "{last}"]\n\n'
          + schedule(calendar="soon"))
    result = load_paths([tmp_path], now=NOW)
    assert result.errors == []
    found = [d for d in result.warnings if "calendar 'soon'" in d.message]
    if warned is None:
        assert found == []
        return
    (warning,) = found
    assert warning.line == 1 and warned in warning.message
    assert "after it, every day fires" in warning.message
    quiet = load_paths([tmp_path], now=NOW, keep_warnings=False)
    assert quiet.warnings == [] and quiet.schedules == result.schedules


def test_validate_cli_reports_calendar_problems_in_text_and_json(tmp_path):
    write(tmp_path, "a.toml", '[calendars.soon]\ndates = ["2026-01-20"]\n\n'
          + schedule(calendar="son"))
    text = CliRunner().invoke(cli, ["validate", str(tmp_path)])
    assert text.exit_code == 1
    assert f"error: {tmp_path / 'a.toml'}:10: schedule 'nightly': unknown calendar 'son'; did " \
           "you mean 'soon'?" in text.output
    # relative to the clock's now: a date long past is warned as ended
    assert f"warning: {tmp_path / 'a.toml'}:1: calendar 'soon': its last date is 2026-01-20 (" \
           in text.output
    doc = json.loads(CliRunner().invoke(cli, ["validate", str(tmp_path), "--format", "json"]).output)
    assert doc["valid"] is False and doc["schedules"] == 1
    assert doc["errors"][0]["schedule"] == "nightly" and doc["errors"][0]["line"] == 10
    assert doc["warnings"][0]["schedule"] is None and doc["warnings"][0]["line"] == 1


def test_files_read_by_several_processes_resolve_calendars_across_them(tmp_path):
    from cronkeeper.schedule import loader

    files = []
    for i, text in enumerate([CALENDAR, schedule(calendar="us-holidays"),
                              schedule("b", calendar="us-holidayz")]):
        files.append((str(write(tmp_path, f"{i}.toml", text)), str(tmp_path)))
    one = loader._load_files(files, NOW, (False, True), readers=1)
    three = loader._load_files(files, NOW, (False, True), readers=3)
    assert three == one
    result = load_paths([tmp_path], now=NOW, keep_specs=False)
    assert [d.message for d in result.errors] == [
        "unknown calendar 'us-holidayz'; did you mean 'us-holidays'?"]


# -- next ------------------------------------------------------------------------------------

@pytest.fixture
def calendar_set(tmp_path: pathlib.Path) -> pathlib.Path:
    write(tmp_path, "cal.toml", '[calendars.h]\ndates = ["2026-12-24", "2026-12-25", '
          '"2027-01-01"]\n')
    write(tmp_path, "jobs.toml", schedule("weekly", "30 9 * * thu,fri", calendar="h",
                                          on_calendar="next_day")
          + "\n" + schedule("daily", "0 2 * * *", calendar="h"))
    return tmp_path


def next_of(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["next", *args])
    return result.exit_code, result.stdout


def test_next_marks_skipped_periods_and_moved_fires(calendar_set):
    code, out = next_of("weekly", "--schedules", str(calendar_set), "--after",
                        "2026-12-20T00:00:00Z", "-n", "6")
    assert code == 0
    assert out.splitlines() == [
        "# calendar 'h' (on_calendar = next_day): 3 dates, the last 2027-01-01",
        "2026-12-24T09:30:00-05:00  EST  2026-12-24T14:30:00Z  skipped: calendar 'h' lists "
        "2026-12-24",
        "2026-12-25T09:30:00-05:00  EST  2026-12-25T14:30:00Z  skipped: calendar 'h' lists "
        "2026-12-25",
        "2026-12-26T09:30:00-05:00  EST  2026-12-26T14:30:00Z  moved from 2026-12-24, "
        "2026-12-25 (calendar 'h' lists them)",
        "2026-12-31T09:30:00-05:00  EST  2026-12-31T14:30:00Z",
        "2027-01-01T09:30:00-05:00  EST  2027-01-01T14:30:00Z  skipped: calendar 'h' lists "
        "2027-01-01",
        "2027-01-02T09:30:00-05:00  EST  2027-01-02T14:30:00Z  moved from 2027-01-01 "
        "(calendar 'h' lists it)",
    ]


def test_next_json_shape_with_a_calendar(calendar_set):
    code, out = next_of("daily", "--schedules", str(calendar_set), "--after",
                        "2026-12-24T00:00:00Z", "-n", "3", "--format", "json")
    assert code == 0
    assert json.loads(out) == {
        "schedule": "daily", "timezone": "America/New_York",
        "fires": [
            {"utc": "2026-12-24T07:00:00Z", "local": "2026-12-24T02:00:00-05:00",
             "skipped": "calendar"},
            {"utc": "2026-12-25T07:00:00Z", "local": "2026-12-25T02:00:00-05:00",
             "skipped": "calendar"},
            {"utc": "2026-12-26T07:00:00Z", "local": "2026-12-26T02:00:00-05:00"},
        ],
        "calendar": {"name": "h", "on_calendar": "skip", "dates": 3, "last_date": "2027-01-01"},
    }
    code, out = next_of("weekly", "--schedules", str(calendar_set), "--after",
                        "2026-12-25T00:00:00Z", "-n", "2", "--format", "json")
    assert json.loads(out)["fires"][1] == {
        "utc": "2026-12-26T14:30:00Z", "local": "2026-12-26T09:30:00-05:00",
        "moved_from": ["2026-12-24", "2026-12-25"]}


def test_calendar_value_is_frozen_hashable_and_shared():
    a = Calendar.of("h", [date(2026, 12, 25), date(2026, 12, 24), date(2026, 12, 25)])
    b = Calendar.of("h", [date(2026, 12, 24), date(2026, 12, 25)])
    assert a is b and hash(a) == hash(b) and a.runs() == ((20811, 20812),)
    assert a != Calendar.of("other", a.dates())
