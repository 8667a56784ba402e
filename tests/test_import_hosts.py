"""`cronkeeper import crontab` on a whole host's crontabs (issue 26): a Debian /etc/crontab and
four of its /etc/cron.d files imported into one folder one after another, a BSD /etc/crontab,
and what the `# FILE:LINE:` comment and the `description` of each schedule keep. The fixture
files under tests/fixtures/import/ are written in the shape those hosts ship."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest
from handlers_for_tests import cronkeeper_exe

from cronkeeper.importing import crontab

FIXTURES = Path(__file__).parent / "fixtures" / "import"
DEBIAN = [
    FIXTURES / "debian" / "crontab",
    FIXTURES / "debian" / "cron.d" / "mdadm",
    FIXTURES / "debian" / "cron.d" / "zfsutils-linux",
    FIXTURES / "debian" / "cron.d" / "sysstat",
    FIXTURES / "debian" / "cron.d" / "php5",
]
BSD = FIXTURES / "bsd" / "crontab"
ZONE = "Europe/Berlin"


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([cronkeeper_exe(), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)  # fmt: skip


def import_system(path: Path, *more: str) -> subprocess.CompletedProcess:
    return cli("import", "crontab", str(path), "--system", "--timezone", ZONE, "--misfire",
               "skip", *more)  # fmt: skip


def names_in(out: Path) -> dict[str, list[str]]:
    return {f.name: list(tomllib.loads(f.read_text())) for f in sorted(out.glob("*.toml"))}


def validate(out: Path) -> dict:
    done = cli("validate", str(out), "--format", "json")
    assert done.returncode == 0, done.stdout
    result = json.loads(done.stdout)
    assert result["errors"] == []
    return result


def test_a_debian_hosts_crontabs_imported_into_one_folder_validate(tmp_path) -> None:
    """The issue's report: /etc/crontab, then mdadm, zfsutils-linux, sysstat and php5 from
    /etc/cron.d, each with `-o schedules`. Three of their commands test `$(date +%d)` or
    `$(date +%w)`; none may be named after it (the clash validate refused)."""
    out = tmp_path / "schedules"
    for path in DEBIAN:
        done = import_system(path, "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert "already defined" not in done.stderr, done.stderr
    assert names_in(out) == {
        "crontab.toml": ["run-parts-cron.hourly", "run-parts-cron.daily", "run-parts-cron.weekly",
                         "run-parts-cron.monthly"],
        "mdadm.toml": ["checkarray"],
        "php5.toml": ["sessionclean"],
        "sysstat.toml": ["debian-sa1", "debian-sa1-2"],
        "zfsutils-linux.toml": ["trim", "scrub"],
    }  # fmt: skip
    validate(out)


def test_a_clash_with_another_file_of_the_folder_is_renamed_and_said(tmp_path) -> None:
    """root's own crontab (`crontab -l > root.crontab`) also runs checkarray: imported after
    mdadm into the same folder, its schedule takes the file's name in front, stderr says so,
    and the folder still validates. Importing it again gives the same file; so does
    re-importing mdadm, whose own file is not a clash."""
    out = tmp_path / "schedules"
    assert import_system(DEBIAN[1], "-o", str(out)).returncode == 0
    root = tmp_path / "root.crontab"
    root.write_text("# monthly check of all arrays, whatever the day\n"
                    "0 3 1 * * /usr/share/mdadm/checkarray --all --quiet\n")  # fmt: skip
    args = ["import", "crontab", str(root), "--timezone", ZONE, "--misfire", "skip", "-o",
            str(out)]  # fmt: skip
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    assert (f"{root}:2: warning: schedule name 'checkarray' is already defined in "
            f"{out / 'mdadm.toml'}, and names are unique across a directory: named "
            "'root-checkarray'") in done.stderr  # fmt: skip
    assert names_in(out) == {"mdadm.toml": ["checkarray"], "root.toml": ["root-checkarray"]}
    validate(out)
    first = (out / "root.toml").read_text()
    again = cli(*args)
    assert again.returncode == 0 and "named 'root-checkarray'" in again.stderr
    assert (out / "root.toml").read_text() == first
    mdadm = (out / "mdadm.toml").read_text()
    rerun = import_system(DEBIAN[1], "-o", str(out))
    assert rerun.returncode == 0 and "already defined" not in rerun.stderr
    assert (out / "mdadm.toml").read_text() == mdadm
    # the stem-prefixed name taken too: suffixed, never a duplicate
    (out / "other.toml").write_text((out / "root.toml").read_text())
    third = cli(*args)
    assert third.returncode == 0
    assert names_in(out)["root.toml"] == ["root-checkarray-2"]
    validate(out)


def test_one_file_into_an_empty_folder_is_what_stdout_shows(tmp_path) -> None:
    """Same input, same output (SPEC §12): reading the folder's names changes nothing there."""
    out = tmp_path / "empty"
    out.mkdir(mode=0o755)
    written = import_system(DEBIAN[0], "-o", str(out))
    shown = import_system(DEBIAN[0])
    assert written.returncode == shown.returncode == 0
    assert (out / "crontab.toml").read_text() == shown.stdout


def test_names_never_come_from_a_command_substitution() -> None:
    names = {e.name for path in DEBIAN + [BSD]
             for e in crontab.convert(path.read_text(), source=str(path), timezone=ZONE,
                                      misfire="skip", owner=None, system=True).entries}  # fmt: skip
    assert not {n for n in names if n.startswith(("date", "hostname", "maxlifetime"))}, names


def schedules_of(path: Path) -> dict[str, dict]:
    done = import_system(path)
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)


def test_bsd_descriptions_are_only_the_comments_right_above() -> None:
    """A BSD /etc/crontab: a `$Header$` banner, SHELL/PATH/HOME lines, the column template and
    a disabled `#0/15 ...` entry (a field this grammar refuses) stand above the first entry;
    none of it is that entry's description."""
    docs = schedules_of(BSD)
    assert list(docs) == ["atrun", "newsyslog", "daily", "weekly", "monthly"]
    assert "description" not in docs["atrun"]
    assert docs["newsyslog"]["description"] == "rotate log files every hour, if necessary"
    assert docs["daily"]["description"] == "do daily/weekly/monthly maintenance"
    assert "description" not in docs["weekly"] and "description" not in docs["monthly"]


def test_debian_descriptions_are_only_the_comments_right_above() -> None:
    crontab_docs = schedules_of(DEBIAN[0])  # the job-definition diagram ends in a template line
    assert all("description" not in d for d in crontab_docs.values())
    mdadm = schedules_of(DEBIAN[1])["checkarray"]["description"]
    assert mdadm.startswith("Runs at 00:57 every Sunday") and "cron.d/mdadm" not in mdadm
    assert schedules_of(DEBIAN[3])["debian-sa1-2"]["description"] == (
        "One more run at 23:59, to rotate the day's statistics file")


@pytest.mark.parametrize(
    ("above", "description"),
    [
        ("# nightly backup\n", "nightly backup"),
        ("# nightly\n# backup\n", "nightly backup"),
        ("# far above\n\n", None),  # a blank line
        ("# far above\n#\n", None),  # a bare '#'
        ("# far above\n# \n# near\n", "near"),
        ("# banner\nSHELL=/bin/sh\n", None),  # a variable line
        ("# banner\nPATH=/bin\n# near\n", "near"),
        ("# old job\n#0/15 * * * * /usr/libexec/atrun\n", None),  # a disabled entry
        ("# old job\n# 30 2 * * * /old/backup\n", None),
        ("# old\n#@daily /old/backup\n", None),
        ("# banner\n#PATH=/usr/local/bin:/bin\n", None),  # a disabled variable
        ("# Edit this file to introduce tasks\n# m h  dom mon dow   command\n", None),
        ("# banner\n#minute\thour\tmday\tmonth\twday\tcommand\n", None),
        ("# 5 ways to fail: see the runbook\n", "5 ways to fail: see the runbook"),
        ("# runs at 2 am on mon-fri, every week\n", "runs at 2 am on mon-fri, every week"),
    ],
)
def test_description_is_the_comment_run_right_above(above: str, description: str | None) -> None:
    done = crontab.convert(above + "30 2 * * * /usr/local/bin/backup.sh\n", source="c",
                           timezone=ZONE, misfire="skip", owner=None, system=False)  # fmt: skip
    assert [e.get("description") for e in done.entries] == [description]


def test_the_provenance_comment_keeps_the_whole_line(tmp_path) -> None:
    """The `# FILE:LINE: line` comment is the audit trail: a line of any length is kept whole
    (tabs and the cronie '-' prefix too); a control character TOML refuses in a comment (a
    carriage return, a vertical tab, an escape) is escaped, so the file still parses."""
    long_line = "0 6 * * * /usr/local/bin/report " + " ".join(f"--part={i:03}" for i in range(80))
    odd_line = "-5\t4 * * *\t/usr/local/bin/odd one\rtwo\x0bthree\x1b[31m"
    source = tmp_path / "host.crontab"
    source.write_text(f"{long_line}\n{odd_line}\r\n")
    out = tmp_path / "schedules"
    done = cli("import", "crontab", str(source), "--timezone", ZONE, "--misfire", "skip",
               "-o", str(out))  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = (out / "host.toml").read_text()
    assert len(long_line) > 600
    assert f"# {source}:1: {long_line}\n" in text and "..." not in text
    assert f"# {source}:2: -5\t4 * * *\t/usr/local/bin/odd one\\x0dtwo\\x0bthree\\x1b[31m\n" in text
    doc = tomllib.loads(text)
    assert doc["report"]["command"][-1] == "--part=079"
    validate(out)
