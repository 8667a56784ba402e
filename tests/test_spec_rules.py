"""Every error and warning of SPEC §3, each with its message and line (cronkeeper.schedule)."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from cronkeeper.errors import ScheduleError
from cronkeeper.schedule import (
    Backoff,
    Diagnostic,
    Misfire,
    Overlap,
    Severity,
    load_paths,
    load_valid,
)

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)

GOOD = """\
[job]
cron = "0 4 * * *"
timezone = "UTC"
misfire = "skip"
task = "pkg.mod:func"
owner = "team-a"
"""


def load(tmp_path, text: str, name: str = "a.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    os.chmod(path, 0o644)
    return load_paths([tmp_path], now=NOW)


def only(diags: list[Diagnostic]) -> Diagnostic:
    assert len(diags) == 1, [d.render() for d in diags]
    return diags[0]


def error(tmp_path, text: str) -> Diagnostic:
    result = load(tmp_path, text)
    assert not result.valid
    assert "job" not in result.schedules.by_name()
    return only(result.errors)


def warning(tmp_path, text: str) -> Diagnostic:
    result = load(tmp_path, text)
    assert result.valid, [d.render() for d in result.errors]
    return only(result.warnings)


def with_line(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


# -- a valid schedule -----------------------------------------------------------------------------


def test_valid_schedule_becomes_a_spec_with_defaults(tmp_path):
    result = load(tmp_path, "\n" + GOOD)
    assert result.valid and result.warnings == []
    (spec,) = result.schedules.specs
    assert spec.name == "job" and spec.cron == "0 4 * * *" and spec.every is None
    assert spec.misfire is Misfire.SKIP and spec.overlap is Overlap.SKIP
    assert (spec.grace, spec.jitter, spec.timeout, spec.max_attempts) == (60.0, 0.0, 600.0, 5)
    assert spec.backoff == Backoff(30.0, 2.0, 3600.0)
    assert spec.catch_up_limit == 24 * 3600.0 and spec.payload_json == "{}"
    assert spec.line == 2 and spec.file.endswith("a.toml")


def test_every_key_is_read(tmp_path):
    text = """\
["billing.nightly"]
every = "1h30m"
timezone = "Europe/Berlin"
misfire = "catch_up"
catch_up_limit = "6h"
overlap = "serial"
command = ["/usr/local/bin/backup", "--full"]
payload = { region = "us", ids = [1, 2], nested = { ok = true, ratio = 0.5 } }
grace = "5m"
jitter = "30s"
timeout = "20m"
max_attempts = 3
backoff = { base = "10s", factor = 1.5, max = "10m" }
permanent_exit_codes = [4, 3, 3]
owner = "team-billing"
description = "Send invoices"
"""
    result = load(tmp_path, text)
    assert result.valid and result.warnings == []
    spec = result.schedules.by_name()["billing.nightly"]
    assert spec.every == 5400.0 and spec.cron is None
    assert spec.misfire is Misfire.CATCH_UP and spec.catch_up_limit == 6 * 3600
    assert spec.overlap is Overlap.SERIAL
    assert spec.command == ("/usr/local/bin/backup", "--full") and spec.task is None
    assert spec.payload == {"region": "us", "ids": [1, 2], "nested": {"ok": True, "ratio": 0.5}}
    assert (spec.grace, spec.jitter, spec.timeout, spec.max_attempts) == (300, 30, 1200, 3)
    assert spec.backoff == Backoff(10.0, 1.5, 600.0)
    assert spec.permanent_exit_codes == (3, 4)
    assert spec.owner == "team-billing" and spec.description == "Send invoices"


# -- errors ---------------------------------------------------------------------------------------


def test_toml_syntax_error_names_the_line(tmp_path):
    d = error(tmp_path, GOOD + "\n[other]\ncron = \n")
    assert d.line == 9 and d.message.startswith("invalid TOML:") and d.schedule is None


def test_same_table_twice_in_one_file_is_a_toml_error(tmp_path):
    d = error(tmp_path, GOOD + "\n" + GOOD)
    assert d.line == 8 and "invalid TOML" in d.message


@pytest.mark.parametrize(
    ("key", "words"), [("timezone", "missing required key 'timezone'"),
                       ("misfire", "missing required key 'misfire'")]
)  # fmt: skip
def test_missing_required_key_points_at_the_header(tmp_path, key, words):
    text = "# comment\n" + "\n".join(line for line in GOOD.splitlines() if not line.startswith(key))
    d = error(tmp_path, text)
    assert d.line == 2 and d.schedule == "job" and words in d.message
    assert "no default" in d.message


def test_unknown_key_suggests_the_close_one(tmp_path):
    d = error(tmp_path, with_line(GOOD, 'timezone = "UTC"', 'timezone = "UTC"\ntimzone = "UTC"'))
    assert d.line == 4
    assert d.message == "unknown key 'timzone'; did you mean 'timezone'?"


def test_unknown_key_in_backoff(tmp_path):
    d = error(tmp_path, GOOD + 'backoff = { base = "1s", factr = 2 }\n')
    assert d.line == 7 and "unknown key 'factr' in 'backoff'; did you mean 'factor'?" in d.message


def test_dotted_header_hints_at_quoting(tmp_path):
    result = load(tmp_path, GOOD.replace("[job]", "[nightly.backup]"))
    first = result.errors[0]
    assert first.schedule == "nightly" and first.line == 1
    assert "quote it: [\"nightly.backup\"]" in first.message


def test_both_cron_and_every(tmp_path):
    d = error(tmp_path, with_line(GOOD, 'cron = "0 4 * * *"', 'cron = "0 4 * * *"\nevery = "1h"'))
    assert d.line == 3 and d.message == "both 'cron' and 'every' are set; keep one"


def test_neither_cron_nor_every(tmp_path):
    d = error(tmp_path, with_line(GOOD, 'cron = "0 4 * * *"\n', ""))
    assert d.line == 1 and "neither 'cron' nor 'every'" in d.message


def test_both_task_and_command(tmp_path):
    d = error(tmp_path, GOOD + 'command = ["/bin/true"]\n')
    assert d.line == 7 and d.message == "both 'task' and 'command' are set; keep one"


def test_neither_task_nor_command(tmp_path):
    d = error(tmp_path, with_line(GOOD, 'task = "pkg.mod:func"\n', ""))
    assert d.line == 1 and "neither 'task' nor 'command'" in d.message


@pytest.mark.parametrize(
    ("cron", "words"),
    [
        ("0 25 * * *", "hour field: 25 is out of range 0-23"),
        ("61 * * * *", "minute field"),
        ("0 0 * * 8", "day-of-week field"),
        ("@reboot", "@reboot"),
        ("0 0 L * 5#6", "day-of-week field: '5#6': K in N#K"),
        ("H(5-3) * * * *", "minute field: range in 'H(5-3)' is reversed"),
        ("* * *", "cron"),
    ],
)
def test_cron_syntax_and_ranges(tmp_path, cron, words):
    d = error(tmp_path, with_line(GOOD, '"0 4 * * *"', f'"{cron}"'))
    assert d.line == 2 and d.message.startswith(f'cron "{cron}": ') and words in d.message


def test_cron_that_never_fires(tmp_path):
    d = error(tmp_path, with_line(GOOD, '"0 4 * * *"', '"0 0 30 2 *"'))
    assert d.line == 2 and d.message == 'cron "0 0 30 2 *" can never fire (no date matches it)'


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "localtime", "posixrules", "/etc/localtime"])
def test_unknown_timezone_and_host_files(tmp_path, zone):
    d = error(tmp_path, with_line(GOOD, '"UTC"', f'"{zone}"'))
    assert d.line == 3 and zone in d.message
    assert "timezone" in d.message


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("grace", '"5 minutes"', "'grace': duration '5 minutes' is not valid"),
        ("timeout", '"10"', "'timeout': duration '10' has no unit"),
        ("jitter", '"-1s"', "'jitter': duration '-1s' is negative"),
        ("timeout", '"0s"', "'timeout' must be greater than 0s"),
        ("grace", "60", "'grace' must be a duration string"),
    ],
)
def test_bad_durations(tmp_path, key, value, words):
    d = error(tmp_path, GOOD + f"{key} = {value}\n")
    assert d.line == 7 and words in d.message


@pytest.mark.parametrize(
    ("every", "words"),
    [("500ms", "not valid"), ("0.5s", "at least 1s"), ("1.5s", "whole number of seconds")],
)
def test_every_is_whole_seconds_of_at_least_one(tmp_path, every, words):
    d = error(tmp_path, with_line(GOOD, 'cron = "0 4 * * *"', f'every = "{every}"'))
    assert d.line == 2 and words in d.message


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ("{ when = 2026-01-01T00:00:00Z }", "'payload.when' is a datetime, which JSON cannot hold"),
        ("{ day = 2026-01-01 }", "'payload.day' is a date"),
        ("{ ratio = nan }", "'payload.ratio' is nan, which strict JSON cannot hold"),
        ("{ deep = { big = inf } }", "'payload.deep.big' is inf"),
        ("{ xs = [1, -inf] }", "'payload.xs[1]' is -inf"),
        ('"region=us"', "'payload' must be a table"),
    ],
)
def test_payload_must_be_a_strict_json_object(tmp_path, payload, words):
    d = error(tmp_path, GOOD + f"payload = {payload}\n")
    assert d.line == 7 and words in d.message


def test_payload_larger_than_8_kib(tmp_path):
    d = error(tmp_path, GOOD + f'payload = {{ blob = "{"x" * 8200}" }}\n')
    assert d.line == 7 and "more than the 8192 allowed" in d.message
    ok = load(tmp_path, GOOD + f'payload = {{ blob = "{"x" * 8000}" }}\n')
    assert ok.valid


def test_payload_in_its_own_table_points_at_the_key(tmp_path):
    text = GOOD + "\n[job.payload]\nregion = \"us\"\nwhen = 2026-01-01\n"
    d = error(tmp_path, text)
    assert d.line == 10 and "'payload.when' is a date" in d.message


def test_duplicate_names_are_reported_in_both_places(tmp_path):
    (tmp_path / "a.toml").write_text(GOOD)
    (tmp_path / "b.toml").write_text("\n\n" + GOOD)
    result = load_paths([tmp_path], now=NOW)
    a, b = sorted(result.errors, key=lambda d: d.file)
    assert (os.path.basename(a.file), a.line) == ("a.toml", 1)
    assert (os.path.basename(b.file), b.line) == ("b.toml", 3)
    assert a.message == f"duplicate schedule name: also defined at {b.file}:3"
    assert b.message == f"duplicate schedule name: also defined at {a.file}:1"
    assert result.schedules.specs == ()


COMMAND = GOOD.replace('task = "pkg.mod:func"', 'command = ["/usr/local/bin/backup"]')


@pytest.mark.parametrize(("mode", "who"), [(0o664, "group"), (0o646, "others"), (0o666, "group and others")])
def test_command_file_writable_by_group_or_others(tmp_path, mode, who):
    path = tmp_path / "a.toml"
    path.write_text(COMMAND)
    os.chmod(path, mode)
    d = only(load_paths([tmp_path], now=NOW).errors)
    assert d.line == 5 and d.schedule == "job"
    assert f"this file is writable by {who}" in d.message and "chmod go-w" in d.message


def test_command_directory_writable_by_group(tmp_path):
    directory = tmp_path / "schedules"
    directory.mkdir()
    (directory / "a.toml").write_text(COMMAND)
    os.chmod(directory / "a.toml", 0o644)
    os.chmod(directory, 0o775)
    d = only(load_paths([directory], now=NOW).errors)
    assert d.line == 5 and f"the directory {directory} that holds it is writable by group" in d.message
    os.chmod(directory, 0o755)
    assert load_paths([directory], now=NOW).valid


def test_writable_task_file_is_fine(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text(GOOD)
    os.chmod(path, 0o666)
    assert load_paths([tmp_path], now=NOW).valid


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('max_attempts = "5"', "'max_attempts' must be an integer, not a string (write 5 without quotes)"),
        ("max_attempts = 0", "'max_attempts' must be between 1 and 1000, got 0"),
        ("max_attempts = true", "'max_attempts' must be an integer, not a boolean"),
        ("owner = 7", "'owner' must be a string, not an integer"),
        ("overlap = \"alow\"", "'overlap' must be one of skip, allow, serial, not \"alow\"; did you mean 'allow'?"),
        ("description = [\"x\"]", "'description' must be a string, not an array"),
        ("backoff = \"30s\"", "'backoff' must be a table"),
        ("backoff = { factor = 0.5 }", "'backoff.factor' must be between 1 and 100, got 0.5"),
        ("backoff = { base = \"2h\" }", "'backoff.max' (3600s) is shorter than 'backoff.base' (7200s)"),
        ("task = \"rm -rf /\"", "is not a task name"),
    ],
)
def test_wrong_value_types_and_ranges(tmp_path, line, words):
    key = line.split(" =")[0]
    text = "\n".join(x for x in GOOD.splitlines() if not x.startswith(key + " ")) + "\n" + line + "\n"
    d = error(tmp_path, text)
    assert d.line == text.splitlines().index(line) + 1
    assert words in d.message


def test_misfire_value_with_did_you_mean(tmp_path):
    d = error(tmp_path, with_line(GOOD, '"skip"', '"catch-up"'))
    assert d.line == 4 and "did you mean 'catch_up'?" in d.message


def test_catch_up_limit_without_catch_up_is_an_error(tmp_path):
    d = error(tmp_path, GOOD + 'catch_up_limit = "6h"\n')
    assert d.line == 7 and "applies only with misfire = \"catch_up\"" in d.message


def test_permanent_exit_codes_need_a_command(tmp_path):
    d = error(tmp_path, GOOD + "permanent_exit_codes = [3]\n")
    assert d.line == 7 and "applies only to 'command' schedules" in d.message


@pytest.mark.parametrize(("codes", "words"), [("[0]", "0 is not an exit code"), ("[256]", "256"), ('["3"]', "integers")])
def test_permanent_exit_codes_range(tmp_path, codes, words):
    d = error(tmp_path, COMMAND + f"permanent_exit_codes = {codes}\n")
    assert d.line == 7 and words in d.message


@pytest.mark.parametrize(
    ("command", "words"),
    [('"ls -l"', "must be an array of strings"), ("[]", "must not be empty"), ('["/bin/x", 1]', "element 1")],
)
def test_command_shape(tmp_path, command, words):
    d = error(tmp_path, COMMAND.replace('["/usr/local/bin/backup"]', command))
    assert d.line == 5 and words in d.message


@pytest.mark.parametrize(
    "name", ['"Nightly"', '"a;rm -rf /"', '"$(reboot)"', '"job\\u001b[31m"', '""', f'"{"a" * 129}"']
)
def test_invalid_names(tmp_path, name):
    d = error(tmp_path, GOOD.replace("[job]", f"[{name}]"))
    assert d.line == 1 and d.message.startswith("invalid schedule name")
    assert "\x1b" not in d.render()


def test_invalid_name_suggests_a_valid_one(tmp_path):
    d = error(tmp_path, GOOD.replace("[job]", '["Nightly Backup"]'))
    assert d.message.endswith("did you mean 'nightly-backup'?")


def test_top_level_key_is_not_a_schedule(tmp_path):
    result = load(tmp_path, 'cron = "0 4 * * *"\n\n' + GOOD)
    d = only(result.errors)
    assert [s.name for s in result.schedules.specs] == ["job"]  # the file's valid table stays
    assert d.line == 1 and d.schedule is None
    assert "top-level key 'cron' is not a schedule: each schedule is a table" in d.message


def test_array_of_tables_is_not_a_schedule(tmp_path):
    d = error(tmp_path, GOOD.replace("[job]", "[[job]]"))
    assert d.line == 1 and "array of tables" in d.message and "write [job]" in d.message


def test_non_utf8_file(tmp_path):
    (tmp_path / "bin.toml").write_bytes(b'[job]\ncron = "\xff\xfe"\n')
    d = only(load_paths([tmp_path], now=NOW).errors)
    assert d.line == 2 and "not a UTF-8 text file" in d.message


def test_deeply_nested_value(tmp_path):
    d = error(tmp_path, "x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert d.line == 1 and ("nested too deeply" in d.message or "invalid TOML" in d.message)


def test_huge_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "huge.toml"
    with open(path, "wb") as f:
        f.truncate(17 * 1024 * 1024)
    d = only(load_paths([path], now=NOW).errors)
    assert "too large" in d.message


def test_missing_path(tmp_path):
    d = only(load_paths([tmp_path / "nope"], now=NOW).errors)
    assert d.line == 0 and d.message == "no such file or directory"


def test_all_problems_of_a_schedule_at_once(tmp_path):
    text = '[job]\ncron = "0 99 * * *"\ntimezone = "Nowhere"\nmisfire = "never"\ntask = 5\n'
    result = load(tmp_path, text)
    assert [d.line for d in result.errors] == [2, 3, 4, 5]
    assert [d.line for d in result.warnings] == [1]  # no owner


# -- warnings ---------------------------------------------------------------------------------------


def test_deprecated_timezone_alias(tmp_path):
    d = warning(tmp_path, with_line(GOOD, '"UTC"', '"US/Pacific"'))
    assert d.line == 3 and d.severity is Severity.WARNING
    assert d.message == "timezone 'US/Pacific' is a deprecated alias; use 'America/Los_Angeles'"


def test_fixed_time_in_a_dst_gap(tmp_path):
    text = with_line(GOOD, '"UTC"', '"America/New_York"').replace('"0 4 * * *"', '"30 2 * * *"')
    d = warning(tmp_path, text)
    assert d.line == 2
    assert "2026-03-08 02:30 does not exist in America/New_York (DST gap)" in d.message
    assert "fires once at 03:00 EDT (07:00Z)" in d.message


def test_fixed_time_in_a_dst_fold(tmp_path):
    text = with_line(GOOD, '"UTC"', '"America/New_York"').replace('"0 4 * * *"', '"30 1 * * *"')
    d = warning(tmp_path, text)
    assert d.line == 2 and "2026-11-01 01:30 occurs twice in America/New_York (DST fold)" in d.message


def test_dst_outside_the_coming_year_is_not_reported(tmp_path):
    text = with_line(GOOD, '"UTC"', '"America/New_York"').replace('"0 4 * * *"', '"30 2 9 3 *"')
    result = load(tmp_path, text)  # 9 March: the gap is on the 8th in 2026, the 14th in 2027
    assert result.valid and result.warnings == []


def test_timeout_longer_than_every_with_overlap_allow(tmp_path):
    text = with_line(GOOD, 'cron = "0 4 * * *"', 'every = "5m"') + 'overlap = "allow"\ntimeout = "10m"\n'
    d = warning(tmp_path, text)
    assert d.line == 8
    assert "'timeout' (\"10m\") is longer than the interval between fires (5m)" in d.message


def test_default_timeout_longer_than_cron_interval_with_overlap_allow(tmp_path):
    text = with_line(GOOD, '"0 4 * * *"', '"*/5 * * * *"') + 'overlap = "allow"\n'
    d = warning(tmp_path, text)
    assert d.line == 7 and "the default timeout (10m)" in d.message and "(5m)" in d.message


def test_timeout_shorter_than_interval_or_overlap_skip_is_quiet(tmp_path):
    base = with_line(GOOD, '"0 4 * * *"', '"*/5 * * * *"')
    assert load(tmp_path, base + 'overlap = "allow"\ntimeout = "4m"\n').warnings == []
    assert load(tmp_path, base + 'timeout = "1h"\n').warnings == []


def test_no_owner(tmp_path):
    d = warning(tmp_path, "\n" + with_line(GOOD, 'owner = "team-a"\n', ""))
    assert d.line == 2 and d.message.startswith("no 'owner'")


def test_empty_file_is_a_warning(tmp_path):
    d = warning(tmp_path, "# nothing here yet\n")
    assert d.line == 1 and d.message == "file defines no schedules"


# -- API ---------------------------------------------------------------------------------------------


def test_load_valid_raises_with_every_diagnostic(tmp_path):
    (tmp_path / "a.toml").write_text('[a]\ncron = "bad"\n')
    with pytest.raises(ScheduleError) as info:
        load_valid([tmp_path], now=NOW)
    assert len(info.value.diagnostics) == 4  # cron, timezone, misfire, task
    assert "4 errors in schedule files" in str(info.value)


def test_load_valid_returns_the_set(tmp_path):
    (tmp_path / "a.toml").write_text(GOOD)
    specs = load_valid([tmp_path / "a.toml"], now=NOW)
    assert [s.name for s in specs.specs] == ["job"]


def test_directories_are_walked_sorted_skipping_dot_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.toml").write_text(GOOD.replace("[job]", "[b]"))
    (tmp_path / "sub" / "a.toml").write_text(GOOD.replace("[job]", "[a]"))
    (tmp_path / ".swap.toml").write_text("garbage [[[")
    (tmp_path / "notes.txt").write_text("garbage [[[")
    result = load_paths([tmp_path, tmp_path / "b.toml"], now=NOW)
    assert result.valid
    assert [os.path.relpath(f, tmp_path) for f in result.files] == ["b.toml", "sub/a.toml"]
    assert [s.name for s in result.schedules.specs] == ["b", "a"]


def test_render_escapes_control_characters():
    d = Diagnostic("a\x1b.toml", 3, "x\x1b[2J", "bad \x07 thing")
    assert d.render() == "a\\x1b.toml:3: schedule 'x\\x1b[2J': bad \\x07 thing"
    assert Diagnostic("dir", 0, None, "m").render() == "dir: m"


# -- repeated tables: a table checked once is remembered, never trusted blindly -----------------


def _twins(body: str, names_tasks: list[tuple[str, str, str]]) -> str:
    """Tables with one body, each under its own name, task and description lines."""
    return "".join(f"[{name}]\n{task}\n{description}\n{body}\n"
                   for name, task, description in names_tasks)  # fmt: skip


def test_remembered_tables_report_what_checking_each_afresh_reports(tmp_path):
    body = ('cron = "30 2 * * *"\ntimezone = "Europe/Berlin"\nmisfire = "skip"\n'
            'overlap = "allow"\ntimeout = "2d"\npayload = { n = 1 }')  # fmt: skip
    text = _twins(body, [
        ("first", 'task = "pkg.mod:one"', 'description = "d1"'),
        ("second", 'task = "pkg.mod:two"', ""),
        ("Third", 'task = "pkg.mod:three"', ""),  # an invalid name: an error, not a copy
        ("fourth", 'task = "not a task!"', ""),  # an invalid task
        ("fifth", 'task = "pkg.mod:five"', "description = 5"),  # not a string
        ("sixth", 'command = ["/bin/true"]', ""),  # command instead of task: another table
        ("seventh", 'task = "pkg.mod:seven"\ncommand = ["/bin/true"]', ""),  # both: an error
    ])  # fmt: skip
    result = load(tmp_path, text)
    from cronkeeper.schedule.fasttoml import parse
    from cronkeeper.schedule.validate import check_schedule

    doc, index = parse(text)
    expected = []
    for name, table in doc.items():
        _, diags = check_schedule(name, table, file=str(tmp_path / "a.toml"), now=NOW,
                                  line_of=lambda *p, _n=name: index.line(_n, *p))  # fmt: skip
        expected.extend(diags)
    by_line = lambda d: d.line  # noqa: E731
    assert sorted(result.diagnostics, key=by_line) == sorted(expected, key=by_line)
    errors = {d.schedule for d in result.errors}
    assert errors == {"Third", "fourth", "fifth", "seventh"}
    # the warnings (DST gap and fold, no owner, timeout longer than the interval) of each copy
    # point at its own lines
    warned = [d for d in result.warnings if d.schedule == "second"]
    assert len(warned) == 4 and {d.line for d in warned} > {10}, [d.render() for d in warned]
    specs = result.schedules.by_name()
    assert set(specs) == {"first", "second", "sixth"}
    assert (specs["first"].task, specs["first"].description, specs["first"].line) == (
        "pkg.mod:one", "d1", 1)  # fmt: skip
    assert (specs["second"].task, specs["second"].description) == ("pkg.mod:two", None)
    assert specs["second"].line == 10
    assert specs["second"].payload_json == specs["first"].payload_json == '{"n":1}'


def test_a_value_of_another_type_is_another_table(tmp_path):
    # 1 == True in Python: a remembered `max_attempts = 1` must not let `true` pass
    twin = with_line(GOOD, "[job]", "[job2]")
    text = GOOD + "max_attempts = 1\n" + twin + "max_attempts = true\n"
    result = load(tmp_path, text)
    assert only(result.errors).schedule == "job2"
    assert "'max_attempts' must be an integer" in only(result.errors).message


def test_files_read_by_several_processes_say_what_one_process_says(tmp_path):
    from cronkeeper.schedule import loader

    bad = with_line(GOOD, 'timezone = "UTC"', 'timezone = "Mars/Olympus"')
    texts = [GOOD, bad + with_line(GOOD, "[job]", "[other]"), "[job]\nmisfire = 1\n", "x = ["]
    files = []
    for i, text in enumerate(texts):  # 'job' defined in three files: duplicates across readers
        path = tmp_path / f"{i}.toml"
        path.write_text(text)
        files.append((str(path), str(tmp_path)))
    one = loader._load_files(files, NOW, (False, True), readers=1)
    three = loader._load_files(files, NOW, (False, True), readers=3)
    assert three == one
    assert [len(result[2]) for result in one] == [0, 1, 5, 1]  # each file's own problems
    everything = load_paths([tmp_path], now=NOW, keep_specs=False)
    assert sum("duplicate schedule name" in d.message for d in everything.errors) == 4


def test_without_warnings_the_errors_and_specs_are_the_same(tmp_path):
    bad = with_line(GOOD, 'timezone = "UTC"', 'timezone = "Mars/Olympus"')
    text = with_line(GOOD, 'owner = "team-a"\n', "") + with_line(bad, "[job]", "[other]")
    load(tmp_path, text)
    full = load_paths([tmp_path], now=NOW)
    quiet = load_paths([tmp_path], now=NOW, keep_warnings=False)
    assert [d.render() for d in full.warnings] == [f"{tmp_path / 'a.toml'}:1: schedule 'job': "
        "no 'owner': nobody will be alerted about its dead letters and missed periods"]  # fmt: skip
    assert quiet.warnings == [] and quiet.errors == full.errors and len(quiet.errors) == 1
    assert quiet.schedules == full.schedules and set(quiet.schedules.by_name()) == {"job"}


def test_a_grace_below_a_second_with_misfire_skip_is_an_error(tmp_path):
    """With grace 0 and misfire skip, every period was skipped as a misfire (the leader decides
    a period milliseconds after it is due): a schedule that validated and never fired (seen on
    a real daemon: `every = "1s"`, 7 periods, 7 skipped, 0 emitted)."""
    d = error(tmp_path, GOOD + 'grace = "0s"\n')
    assert d.line == 7
    assert d.message.startswith('grace must be at least 1s with misfire = "skip"')
    assert "would never fire" in d.message and 'misfire = "latest"' in d.message
    for fine in ('grace = "1s"\n', 'grace = "2m"\n'):  # from a second up: as before
        assert load(tmp_path, GOOD + fine).valid
    for misfire in ("latest", "catch_up"):  # late periods still run: grace only classifies them
        other = with_line(GOOD, 'misfire = "skip"', f'misfire = "{misfire}"')
        assert load(tmp_path, other + 'grace = "0s"\n').valid
