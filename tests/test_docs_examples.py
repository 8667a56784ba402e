"""The docs stay true to the code, cheaply: every TOML example in README.md and docs/*.md
validates as what it is (a schedule file, a relay config or a notify config), the example
schedule directories validate, and every `cronkeeper` command line in their sh blocks names a
command that exists and only options that command has (a renamed flag fails here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
EMPTY_ICS = "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//docs test//EN\r\nEND:VCALENDAR\r\n"


def _blocks(kind: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(rf"^```{kind}\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(REPO)}:{line}", match.group(1)))
    return found


TOML = [b for b in _blocks("toml") if not b[1].startswith("# add to")]  # fragments of a table


@pytest.mark.parametrize(("where", "body"), TOML, ids=[w for w, _ in TOML])
def test_each_toml_example_validates(where, body, tmp_path):
    path = tmp_path / "example.toml"
    path.write_text(body)
    for ics in re.findall(r'^ics = "([^"]+)"', body, re.M):
        (tmp_path / ics).write_text(EMPTY_ICS)
    if "[targets." in body:
        args = ["validate", "--relay-config", str(path)]
    elif "[sinks." in body or body.startswith("heartbeat_url"):
        args = ["validate", "--notify-config", str(path)]
    else:
        args = ["validate", str(path)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, f"{where}: {result.output}"


@pytest.mark.parametrize("directory", ["examples/schedules", "schedules"])
def test_the_example_schedule_directories_validate(directory):
    result = CliRunner().invoke(cli, ["validate", str(REPO / directory)])
    assert result.exit_code == 0, result.output


def _command_lines() -> list[tuple[str, str]]:
    found = []
    for where, body in _blocks("sh"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            for part in re.split(r"&&|\|\||;|\|(?=\s)", line):
                part = part.strip()
                if re.match(r"(\S*/)?cronkeeper\s", part) and not part.startswith("cronkeeper/"):
                    found.append((where, part))
    return found


COMMANDS = _command_lines()


@pytest.mark.parametrize(("where", "line"), COMMANDS, ids=[f"{w} {c[:60]}" for w, c in COMMANDS])
def test_each_documented_command_line_names_real_commands_and_options(where, line):
    words = shlex.split(line.replace("[", " ").replace("]", " "))[1:]
    command: click.Command = cli
    with click.Context(cli) as ctx:  # the group is lazy: get_command imports each command
        while isinstance(command, click.Group) and words:
            sub = command.get_command(ctx, words[0])
            if sub is None:
                break
            command = sub
            words.pop(0)
    assert not isinstance(command, click.Group), f"{where}: {line!r}: no such command"
    known = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
    for word in words:
        for flag in word.split("|"):
            flag = flag.split("=", 1)[0]
            if flag.startswith("--"):
                assert flag in known, f"{where}: {line!r}: {command.name} has no {flag}"
