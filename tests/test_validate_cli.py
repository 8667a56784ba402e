"""`cronkeeper validate` end to end: text and JSON output, exit codes, hostile input (SPEC §3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
BROKEN = REPO / "tests" / "fixtures" / "broken"
SCRIPT = Path(sys.executable).parent / "cronkeeper"

GOOD = """\
[job]
cron = "0 4 * * *"
timezone = "UTC"
misfire = "skip"
task = "pkg.mod:func"
owner = "team-a"
"""


def run(*args: str):
    return CliRunner().invoke(cli, ["validate", *args])


def write(directory: Path, name: str, content: str | bytes, mode: int = 0o644) -> Path:
    path = directory / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    os.chmod(path, mode)
    return path


def test_example_schedules_are_valid():
    result = run(str(REPO / "schedules"))
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1].endswith(": 0 errors, 0 warnings")
    assert "6 schedules in 5 files" in result.output


def test_example_schedules_through_the_console_script():
    proc = subprocess.run(
        [str(SCRIPT), "validate", str(REPO / "schedules")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 errors" in proc.stdout


def test_broken_directory_names_every_problem_with_file_and_line(tmp_path):
    directory = tmp_path / "broken"
    shutil.copytree(BROKEN, directory)
    os.chmod(directory, 0o755)
    write(directory, "16-writable-command.toml", GOOD.replace(
        'task = "pkg.mod:func"', 'command = ["/usr/local/bin/backup"]').replace("[job]", "[writable]"),
        mode=0o666)  # fmt: skip
    result = run(str(directory))
    assert result.exit_code == 1
    out = result.output
    expected = [
        ("01-syntax.toml:3: ", "invalid TOML"),
        ("02-missing.toml:1: schedule 'missing-keys': ", "missing required key 'timezone'"),
        ("02-missing.toml:1: schedule 'missing-keys': ", "missing required key 'misfire'"),
        ("03-unknown-key.toml:7: schedule 'unknown-key': ", "did you mean 'timeout'?"),
        ("03-unknown-key.toml:1: schedule 'unknown-key': ", "duplicate schedule name"),
        ("04-both-cron-every.toml:3: schedule 'both-when': ", "both 'cron' and 'every'"),
        ("05-cron-range.toml:2: schedule 'bad-cron': ", "hour field: 24 is out of range"),
        ("06-never-fires.toml:2: schedule 'never': ", "can never fire"),
        ("07-timezone.toml:3: schedule 'bad-zone': ", "localtime"),
        ("08-duration.toml:7: schedule 'bad-duration': ", "'grace': duration '1 minute'"),
        ("09-payload.toml:7: schedule 'bad-payload': ", "'payload.at' is a datetime"),
        ("10-duplicate.toml:1: schedule 'unknown-key': ", "duplicate schedule name"),
        ("11-type.toml:7: schedule 'bad-type': ", "'max_attempts' must be an integer"),
        ("12-both-task-command.toml:6: schedule 'both-what': ", "both 'task' and 'command'"),
        ("13-not-a-table.toml:1: ", "is not a schedule"),
        ("14-bad-name.toml:1: schedule 'rm -rf /; echo \\x1b[31m': ", "invalid schedule name"),
        ("15-binary.toml:2: ", "not a UTF-8 text file"),
        ("16-writable-command.toml:5: schedule 'writable': ", "writable by group and others"),
    ]
    lines = out.splitlines()
    for where, words in expected:
        assert any(where in line and words in line and line.startswith("error: ") for line in lines), (
            where, words, out)  # fmt: skip
    assert "\x1b" not in out
    assert "Traceback" not in out
    assert lines[-1] == "13 schedules in 16 files: 18 errors, 0 warnings"


def test_json_format(tmp_path):
    write(tmp_path, "a.toml", GOOD + "\n[two]\nevery = \"5m\"\ntimezone = \"US/Eastern\"\n"
          "misfire = \"skip\"\ntask = \"x\"\n" + "\n[three]\ncron = \"nope\"\n")  # fmt: skip
    result = run("--format", "json", str(tmp_path))
    assert result.exit_code == 1
    doc = json.loads(result.output)
    assert set(doc) == {"valid", "schedules", "errors", "warnings"}
    assert doc["valid"] is False and doc["schedules"] == 3
    for item in doc["errors"] + doc["warnings"]:
        assert {"file", "line", "schedule", "message"} <= set(item)
    assert {(e["schedule"], e["line"]) for e in doc["errors"]} == {("three", 14), ("three", 15)}
    warned = {(w["schedule"], w["line"], w["message"]) for w in doc["warnings"]}
    assert ("two", 10, "timezone 'US/Eastern' is a deprecated alias; use 'America/New_York'") in warned
    assert ("two", 8, "no 'owner': nobody will be alerted about its dead letters and missed periods") in warned


def test_json_valid(tmp_path):
    write(tmp_path, "a.toml", GOOD)
    result = run("--format", "json", str(tmp_path / "a.toml"))
    assert result.exit_code == 0
    assert json.loads(result.output) == {"valid": True, "schedules": 1, "errors": [], "warnings": []}


def test_warnings_alone_exit_zero(tmp_path):
    write(tmp_path, "a.toml", GOOD.replace('owner = "team-a"\n', ""))
    result = run(str(tmp_path))
    assert result.exit_code == 0
    assert result.output.splitlines()[0].startswith("warning: ")
    assert result.output.splitlines()[-1] == "1 schedule in 1 file: 0 errors, 1 warning"


def test_usage_errors_exit_2(tmp_path):
    assert run().exit_code == 2
    result = run(str(tmp_path / "missing.toml"))
    assert result.exit_code == 2 and "no such file or directory" in result.output


HOSTILE = {
    "garbage.toml": b"\x00\x01\x02 [[[ ]]] === \"\"\" ''' \n\t\r\n",
    "binary.toml": bytes(range(256)) * 64,
    "empty.toml": b"",
    "deep.toml": b"a = " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "deep-tables.toml": b"x = " + b"{ a = " * 3000 + b"1" + b" }" * 3000 + b"\n",
    "escape.toml": b'["\\u001b]0;pwned\\u0007\\u001b[2J"]\ncron = "0 4 * * *"\n',
    "shell.toml": b'["$(rm -rf ~)`id`;|&"]\ncron = "* * * * *"\n',
    "toplevel.toml": b'cron = "0 4 * * *"\ntimezone = "UTC"\n',
    "huge-line.toml": b"[a]\ndescription = \"" + b"x" * 3_000_000 + b"\"\n",
    "unterminated.toml": b'[a]\ndescription = """never closed\n',
    "bom.toml": b"\xef\xbb\xbf" + GOOD.encode(),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_input_never_shows_a_traceback(tmp_path, name):
    write(tmp_path, name, HOSTILE[name])
    result = run(str(tmp_path))
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "\x1b" not in result.output and "\x07" not in result.output
    expected = 0 if name in ("empty.toml", "bom.toml") else 1
    assert result.exit_code == expected, result.output
    if expected:
        assert f"{name}:" in result.output and "error: " in result.output


def test_hostile_directory_through_the_console_script(tmp_path):
    for name, content in HOSTILE.items():
        write(tmp_path, name, content)
    proc = subprocess.run(
        [str(SCRIPT), "validate", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "\x1b" not in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("4 schedules in 11 files: ")


def test_validate_does_not_import_the_database_stack():
    code = (
        "import sys; from cronkeeper.cli.main import cli; "
        "from click.testing import CliRunner; "
        f"r = CliRunner().invoke(cli, ['validate', {str(REPO / 'schedules')!r}]); "
        "bad = [m for m in ('sqlalchemy', 'psycopg', 'prometheus_client') if m in sys.modules]; "
        "print(r.exit_code, bad)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "0 []", proc.stdout + proc.stderr


# Values nested deeper than Python's stack (issue 21): tomllib reads a header or a dotted key of
# 2,000 levels, and ran cronkeeper's checks out of recursion (exit 70, "internal error").
# Each case: the file, then (line, message) of the error expected, and no other error but the
# ones a schedule without that key has.
_BODY = 'cron = "0 4 * * *"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t"\nowner = "o"\n'
_MANY = "".join(f"[s{i}]\n{_BODY}" for i in range(60))  # the checks' memo is in use by then
_DEEP_LEVELS = "levels deep, more than the 64 allowed"
DEEP = {
    "header": ("[x" + ".a" * 2000 + "]\nk = 1\n",
               1, "schedule 'x': 'a' nests tables or arrays 2000 " + _DEEP_LEVELS),
    "payload-header": (_MANY + "[x]\n" + _BODY + "[x.payload" + ".a" * 2000 + "]\nk = 1\n",
                       60 * 6 + 7, "schedule 'x': 'payload' nests tables or arrays 2001 "
                       + _DEEP_LEVELS),
    "payload-dotted-key": ("[x]\n" + _BODY + "payload" + ".a" * 3000 + " = 1\n",
                           7, "schedule 'x': 'payload' nests tables or arrays 3000 "
                           + _DEEP_LEVELS),
    "array-of-tables": ("[x]\n" + _BODY + "[[x.backoff" + ".a" * 2000 + "]]\nk = 1\n",
                        7, "schedule 'x': 'backoff' nests tables or arrays 2002 "
                        + _DEEP_LEVELS),
    "payload-just-too-deep": ("[x]\n" + _BODY + "payload" + ".a" * 65 + " = 1\n",
                              7, "schedule 'x': 'payload' nests tables or arrays 65 "
                              + _DEEP_LEVELS),
    "inline-table": ("[x]\n" + _BODY + "\npayload = " + "{ a = " * 3000 + "1" + " }" * 3000
                     + "\n", 8, "invalid TOML: arrays or inline tables nested too deeply to read"),
    "inline-array": ("[x]\n" + _BODY + "\n\nextra = " + "[" * 3000 + "]" * 3000 + "\n",
                     9, "invalid TOML: arrays or inline tables nested too deeply to read"),
}


@pytest.mark.parametrize("case", sorted(DEEP))
def test_a_value_nested_too_deeply_is_an_error_at_its_line(tmp_path, case):
    content, line, message = DEEP[case]
    path = write(tmp_path, f"{case}.toml", content)
    result = run("--format", "json", str(path))
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    errors = json.loads(result.output)["errors"]
    found = [(e["line"], e["message"] if e["schedule"] is None
              else f"schedule '{e['schedule']}': {e['message']}") for e in errors]
    assert (line, message) in found, found
    assert all(e["schedule"] in (None, "x") for e in errors), errors  # the other 60 are valid


def test_a_payload_at_the_depth_limit_is_valid(tmp_path):
    path = write(tmp_path, "a.toml", "[x]\n" + _BODY + "payload" + ".a" * 64 + " = 1\n")
    result = run(str(path))
    assert result.exit_code == 0, result.output


def test_a_deep_header_through_the_console_script(tmp_path):
    write(tmp_path, "deep.toml", DEEP["header"][0])
    proc = subprocess.run([str(SCRIPT), "validate", str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "internal error" not in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert f"{tmp_path / 'deep.toml'}:1: schedule 'x': 'a' nests tables" in proc.stdout


def test_a_nul_character_postgresql_cannot_store_is_an_error_at_its_line(tmp_path):
    """A string holding NUL ("\\u0000") passed validate, and the daemon then failed to record
    its version every term ("unsupported Unicode escape sequence"), firing nothing."""
    write(tmp_path, "a.toml", GOOD.replace('"team-a"', '"team\\u0000a"')
          + 'description = "x\\u0000"\npayload = {k = ["ok", "a\\u0000b"]}\n\n'
          + GOOD.replace("[job]", "[job2]") + 'payload = {"k\\u0000" = 1}\n')
    result = run(str(tmp_path))
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    for where, line in (("'owner'", 6), ("'description'", 7), ("'payload.k[1]'", 8),
                        ("'payload' key ", 16)):
        assert any(where in out and f"a.toml:{line}:" in out and "NUL" in out
                   for out in result.output.splitlines()), (where, result.output)
