"""`cronkeeper import crontab` (issue 11, SPEC §12): a crontab holding every syntax converted,
validated, run, and its fires checked against cron's own semantics for a year in a DST zone."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from handlers_for_tests import cronkeeper_exe

from cronkeeper.importing import crontab
from cronkeeper.importing.compare import cronkeeper_fires
from cronkeeper.importing.cronie import simulate
from cronkeeper.importing.naming import command_name, unique

FIXTURE = Path(__file__).parent / "fixtures" / "import" / "everything.crontab"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "import.md"
ZONE = "Europe/Berlin"
YEAR_START = datetime(2026, 12, 1, tzinfo=UTC)
YEAR_END = YEAR_START + timedelta(days=365)


def cli(*args: str, cwd: Path | None = None, stdin: str | None = None):
    return subprocess.run([cronkeeper_exe(), *args], capture_output=True, text=True, cwd=cwd,
                          input=stdin, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("everything") / "schedules"
    done = cli("import", "crontab", str(FIXTURE), "--timezone", ZONE, "--misfire", "catch_up",
               "-o", str(out))  # fmt: skip
    return done, out


def schedules(out: Path) -> dict[str, dict]:
    return tomllib.loads((out / "everything.toml").read_text())


def test_every_syntax_converts_and_the_output_validates(converted) -> None:
    done, out = converted
    assert done.returncode == 1, done.stderr  # @reboot and the broken lines were left out
    docs = schedules(out)
    assert list(docs) == [
        "ranges", "steps", "names", "either", "both", "hourly-ish", "macro-hourly", "macro-daily",
        "macro-midnight", "macro-weekly", "macro-monthly", "macro-yearly", "macro-annually",
        "at-0230", "twice-in-the-gap", "at-0159", "not-logged", "find", "cat", "echo", "echo-2",
        "backup", "backup-2", "new-york-0130", "new-york-elapsed", "kolkata",
    ]  # fmt: skip
    valid = cli("validate", str(out), "--format", "json")
    assert valid.returncode == 0, valid.stdout
    import json

    assert json.loads(valid.stdout)["errors"] == []
    assert (out / "everything.toml").stat().st_mode & 0o777 == 0o644
    # the time fields as written (cronkeeper's grammar and DST rules are cronie's)
    assert docs["either"]["cron"] == "0 0 1,15 * fri"
    assert docs["names"]["cron"] == "15 4 * jan,jul mon-fri"
    assert docs["macro-annually"]["cron"] == "@annually"
    assert docs["not-logged"]["cron"] == "0 3 * * *"  # cronie's '-' prefix dropped
    # variables: PATH (quoted, spaces around '=') and the user's own, through env
    path = "PATH=/usr/local/bin:/usr/bin:/bin"
    assert docs["ranges"]["command"] == ["/usr/bin/env", "GREETING=hello world", path,
                                         "/usr/local/bin/ranges", "--verbose"]  # fmt: skip
    assert docs["find"]["command"][-3:] == [
        "/bin/sh", "-c", "find /var/tmp -name '*.tmp' -mtime +7 -delete 2>/dev/null || true"
    ]
    assert all(d["owner"] == "ops@example.com" for d in docs.values())  # MAILTO
    assert all(d["max_attempts"] == 1 for d in docs.values())  # cron never retried
    assert docs["backup"]["jitter"] == "5m" and "jitter" not in docs["ranges"]  # RANDOM_DELAY
    assert docs["ranges"]["description"] == "ranges and lists"
    assert "description" not in docs["new-york-0130"]  # a commented-out entry is not one
    # CRON_TZ / TZ apply to the lines below; CRON_TZ wins; TZ is passed to the command too
    assert docs["new-york-0130"]["timezone"] == "America/New_York"
    assert docs["kolkata"]["timezone"] == "Asia/Kolkata"
    assert "TZ=Asia/Kolkata" in docs["kolkata"]["command"]
    assert docs["at-0230"]["timezone"] == ZONE


def test_each_left_out_line_is_reported_with_its_line_and_reason(converted) -> None:
    done, _ = converted
    lines = {int(m[1]): m[2] for m in re.finditer(r"everything\.crontab:(\d+): (.*)", done.stderr)}
    text = FIXTURE.read_text().split("\n")
    assert text[lines_of(lines, "@reboot") - 1].startswith("@reboot")
    expected = {
        "@reboot runs once at boot": "@reboot /usr/local/bin/at-boot",
        "CRON_TZ=Mars/Olympus_Mons: unknown timezone": "0 9 * * * /usr/local/bin/on-mars",
        "never fires": "0 0 30 2 * /usr/local/bin/never",
        "day-of-week field: 8 is out of range": "0 0 * * 8 /usr/local/bin/bad-dow",
        "step 61": "*/61 * * * * /usr/local/bin/big-step",
        "not a crontab entry": "this line is not cron",
    }
    for reason, source_line in expected.items():
        number = lines_of(lines, reason)
        assert text[number - 1] == source_line, reason
    assert "6 left out" in done.stderr and "26 schedules converted" in done.stderr
    mailto = lines[5]
    assert mailto.startswith("warning: MAILTO: cronkeeper keeps each run's output")
    assert "`cronkeeper output KEY`" in mailto and "`cronkeeper history`" in mailto
    assert "lost" not in mailto and "mails no output" not in mailto


def lines_of(lines: dict[int, str], needle: str) -> int:
    found = [n for n, message in lines.items() if needle in message]
    assert len(found) == 1, (needle, lines)
    return found[0]


def test_same_input_same_output(converted, tmp_path) -> None:
    _, out = converted
    again = cli("import", "crontab", str(FIXTURE), "--timezone", ZONE, "--misfire", "catch_up")
    assert again.returncode == 1
    assert again.stdout == (out / "everything.toml").read_text()


def test_percent_and_variables_reach_the_command_as_cron_gave_them(converted, tmp_path) -> None:
    """Run the converted argv for real: the text after % is stdin, \\% a literal %, and the
    crontab's variables are in the environment."""
    docs = schedules(converted[1])
    target = tmp_path / "out.txt"
    env = {**os.environ, "OUT": str(target)}
    subprocess.run(docs["cat"]["command"], env=env, check=True, timeout=30)
    assert target.read_text() == "first line\nsecond line%with a percent\n"
    subprocess.run(docs["echo"]["command"], env=env, check=True, timeout=30)
    assert target.read_text() == "hello world\n"


def original_fields(toml_text: str) -> dict[str, str]:
    """Each schedule's time fields as the crontab line wrote them, found through the
    `# FILE:LINE:` comment above its table, so a field mangled in conversion shows up."""
    lines = FIXTURE.read_text().split("\n")
    found = {}
    for number, name in re.findall(r"everything\.crontab:(\d+): .*\n(?:#.*\n)*\[\"([^\"]+)\"\]",
                                   toml_text):
        line = lines[int(number) - 1].lstrip("-")
        found[name] = line.split()[0] if line.startswith("@") else " ".join(line.split()[:5])
    return found


def _fires_by_cronie_and_cronkeeper(docs: dict[str, dict], toml_text: str):
    """Per schedule: (cronie's fires for the original line, cronkeeper's for the converted
    schedule) over a year, cronie's daemon in ZONE."""
    names = list(docs)
    originals = original_fields(toml_text)
    assert sorted(originals) == sorted(names)
    jobs, zones = [], []
    for name in names:
        zone = docs[name]["timezone"]
        jobs.append((originals[name], zone if zone != ZONE else None))
        zones.append(zone)
    old = simulate(jobs, ZONE, YEAR_START, YEAR_END)
    from cronkeeper.importing.model import Entry

    new = [
        cronkeeper_fires(Entry(n, "", (("cron", docs[n]["cron"]), ("timezone", z))),
                         YEAR_START, YEAR_END)
        for n, z in zip(names, zones, strict=True)
    ]  # fmt: skip
    return {n: (o, k) for n, o, k in zip(names, old, new, strict=True)}


def test_a_year_of_fires_matches_cronie_in_a_dst_zone(converted) -> None:
    """Every converted schedule fires exactly when cronie would, over a year holding both of
    Europe/Berlin's DST changes, except in the two ways SPEC §4 and cronie's own source
    document: several times of one spring gap collapse into one fire (cronie runs each), and
    a CRON_TZ job in its own zone's fold (cronie steps by the host's clock and runs it twice)."""
    docs = schedules(converted[1])
    compared = _fires_by_cronie_and_cronkeeper(docs, (converted[1] / "everything.toml").read_text())
    berlin_spring = int(datetime(2027, 3, 28, 1, 0, tzinfo=UTC).timestamp())  # 03:00 CEST
    ny_fold_second = int(datetime(2027, 11, 7, 6, 30, tzinfo=UTC).timestamp())  # 01:30 EST
    expected_extra = {
        "twice-in-the-gap": [berlin_spring],  # 02:00 and 02:30 both run at 03:00 under cronie
        "new-york-0130": [ny_fold_second],
    }
    for name, (old, new) in compared.items():
        assert len(new) == len(set(new)), name
        extra = sorted((Counter(old) - Counter(new)).elements())
        missing = sorted((Counter(new) - Counter(old)).elements())
        assert missing == [], name
        assert extra == expected_extra.get(name, []), name
    # the DST behaviour both share, pinned: the gap's 02:30 fires once at 03:00, the fold's once
    old, new = compared["at-0230"]
    spring = [t for t in new if datetime.fromtimestamp(t, UTC).date().isoformat() == "2027-03-28"]
    assert spring == [berlin_spring]
    autumn = [t for t in new if datetime.fromtimestamp(t, UTC).date().isoformat() == "2027-10-31"]
    assert autumn == [int(datetime(2027, 10, 31, 0, 30, tzinfo=UTC).timestamp())]
    assert len(compared["new-york-elapsed"][1]) == 2 * 24 * 365  # the fold's half hours twice, the gap's not


def test_compare_marks_the_differences_and_shows_dst_days(tmp_path) -> None:
    source = tmp_path / "c.crontab"
    source.write_text("0,30 2 * * * /bin/true\nCRON_TZ=America/New_York\n30 1 * * * /bin/false\n")
    done = cli("import", "crontab", str(source), "--timezone", ZONE, "--misfire", "skip",
               "--compare", "--from", "2026-12-01T00:00:00Z")  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert not (tmp_path / "schedules").exists() and "[" not in out.split("==")[0]
    assert "DST 2027-03-28 in Europe/Berlin (CET -> CEST):" in out
    assert " ! 2027-03-28T03:00:00+02:00    -" in out  # cronie's second run in the gap
    assert "DST 2027-11-07 in America/New_York (EDT -> EST):" in out
    assert " ! 2027-11-07T01:30:00-05:00    -" in out
    assert "DST 2027-03-28 in Europe/Berlin, cronie's zone" in out
    assert out.rstrip().endswith("2 differing instants")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00\x00binary"), "a binary file"),
        (lambda p: p.write_bytes(b"0 1 * * * caf\xe9\n"), "not UTF-8 text"),
        (lambda p: p.mkdir(), "a directory, not a crontab"),
        (lambda p: os.mkfifo(p), "a named pipe (FIFO), not a crontab"),
        (lambda p: p.symlink_to(p), "a symlink loop"),
        (lambda p: None, "no such file"),
    ],
)
def test_unusable_input_exits_2_and_writes_nothing(tmp_path, make, message) -> None:
    source = tmp_path / "input"
    make(source)
    out = tmp_path / "never-created"
    done = cli("import", "crontab", str(source), "--timezone", ZONE, "--misfire", "skip",
               "-o", str(out))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == "" and not out.exists()


def test_a_file_whose_read_fails_exits_2(tmp_path) -> None:
    """Tests run as root, so chmod 000 stops nothing: /proc/self/mem is a regular file whose
    read at offset 0 fails (EIO), an honest unreadable file."""
    out = tmp_path / "out"
    done = cli("import", "crontab", "/proc/self/mem", "--timezone", ZONE, "--misfire", "skip",
               "-o", str(out))  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "cannot read" in done.stderr and not out.exists()


def test_usage_errors(tmp_path) -> None:
    source = tmp_path / "c"
    source.write_text("0 1 * * * /bin/true\n")
    bad_zone = cli("import", "crontab", str(source), "--timezone", "Mars/Base", "--misfire", "skip")
    assert bad_zone.returncode == 2 and "unknown timezone" in bad_zone.stderr
    no_misfire = cli("import", "crontab", str(source), "--timezone", ZONE)
    assert no_misfire.returncode == 2 and "--misfire" in no_misfire.stderr


def test_everything_converted_exits_0_and_stdin_works() -> None:
    done = cli("import", "crontab", "-", "--timezone", "UTC", "--misfire", "latest",
               "--owner", "team-a", stdin="# tidy\n0 1 * * * /usr/bin/tidy --all\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = tomllib.loads(done.stdout)
    assert doc == {"tidy": {"cron": "0 1 * * *", "timezone": "UTC", "misfire": "latest",
                            "command": ["/usr/bin/tidy", "--all"], "max_attempts": 1,
                            "owner": "team-a", "description": "tidy"}}  # fmt: skip


def test_system_crontab_user_field(tmp_path) -> None:
    source = tmp_path / "php"
    source.write_text("SHELL=/bin/bash\n09,39 * * * * root [ -x /usr/lib/php/sessionclean ] && "
                      "/usr/lib/php/sessionclean\n17 * * * * www-data\n")  # fmt: skip
    done = cli("import", "crontab", str(source), "--system", "--timezone", ZONE, "--misfire",
               "skip")  # fmt: skip
    assert done.returncode == 1
    doc = tomllib.loads(done.stdout)
    assert doc["sessionclean"]["command"] == [
        "/bin/bash", "-c", "[ -x /usr/lib/php/sessionclean ] && /usr/lib/php/sessionclean"]
    assert "cron ran this as user 'root'" in done.stdout  # the comment above it
    assert f"{source}:2: warning: cron ran this as user 'root'" in done.stderr
    assert f"{source}:3: a system crontab entry needs a user field" in done.stderr


def test_docs_example_runs_verbatim(tmp_path) -> None:
    """docs/import.md's crontab example, with its command line as written."""
    doc = DOCS.read_text()
    (tmp_path / "web01.crontab").write_text(re.search(r"```crontab\n(.*?)```", doc, re.S)[1])
    command = re.search(r"```sh\n(cronkeeper import crontab [^\n]*-o schedules/)\n```", doc)[1]
    done = cli(*command.split()[1:], cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    for line in re.search(r"prints on stderr\n\n```\n(.*?)```", doc, re.S)[1].splitlines():
        assert line in done.stderr
    written = (tmp_path / "schedules" / "web01.toml").read_text()
    shown = re.search(r"The first schedule it writes:\n\n```toml\n(.*?)```", doc, re.S)[1]
    assert shown in written
    assert len(tomllib.loads(written)) == 7
    assert cli("validate", str(tmp_path / "schedules")).returncode == 0
    compare = re.search(r"```sh\n(cronkeeper import crontab [^\n]*--compare[^\n]*)\n```", doc)[1]
    shown = cli(*compare.split()[1:], cwd=tmp_path)
    assert "2027-11-07T01:30:00-05:00" in shown.stdout and "1 differing instant" in shown.stdout


@pytest.mark.parametrize(
    ("command", "stdin"),
    [
        ("cat%a%b", "a\nb"),
        ("cat%a\\%b%", "a%b\n"),
        ("echo 100\\%", None),
        ("printf x\\\\%y", "y"),
    ],
)
def test_percent_split_follows_cronie(command: str, stdin: str | None) -> None:
    body, data = crontab.split_percent(command)
    assert data == stdin
    if command == "echo 100\\%":
        assert body == "echo 100%"


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("/usr/local/bin/backup.sh --full", "backup"),
        ("cd /srv/app && python manage.py clearsessions", "manage-clearsessions"),
        ("FOO=1 nice -n 10 flock -n /tmp/x.lock /opt/sync.py", "sync"),
        ("test -x /usr/sbin/anacron || ( cd / && run-parts --report /etc/cron.daily )",
         "run-parts-cron.daily"),
        ("%%%", "job"),
        ("[ $(date +\\%w) -eq 0 ] && [ -x /usr/lib/zfs-linux/scrub ] && /usr/lib/zfs-linux/scrub",
         "scrub"),
        ("if [ -x /usr/share/mdadm/checkarray ] && [ $(date +%d) -le 7 ]; then "
         "/usr/share/mdadm/checkarray --cron; fi", "checkarray"),
        ("`date +%s` > /tmp/x; /opt/tick", "tick"),
        ("echo \"$(hostname) up\" | mail -s 'a $(b)' root", "echo"),
        ("$HOME/bin/sync.sh", "sync"),
        ("${PYTHON:-python3} /srv/jobs/reindex.py", "reindex"),
        ("while true; do /usr/bin/poll; done", "poll"),
    ],
)
def test_names_come_from_the_program(command: str, name: str) -> None:
    assert command_name(command) == name


def test_names_are_unique_and_stable() -> None:
    assert unique(["a", "b", "a", "a", ""]) == ["a", "b", "a-2", "a-3", "job"]
    long = "x" * 60
    assert unique([long, long])[1] == "x" * 58 + "-2"


def test_a_group_writable_output_directory_is_warned_about(tmp_path) -> None:
    """validate refuses command schedules in a directory others can write: say so at once."""
    out = tmp_path / "shared"
    out.mkdir()
    out.chmod(0o777)
    source = tmp_path / "c"
    source.write_text("0 1 * * * /bin/true\n")
    done = cli("import", "crontab", str(source), "--timezone", "UTC", "--misfire", "skip",
               "-o", str(out))  # fmt: skip
    assert done.returncode == 0
    assert f"warning: {out} is writable by group or others (mode 0777)" in done.stderr
    assert cli("validate", str(out)).returncode == 1  # what the warning predicted


def test_a_name_another_file_of_the_directory_defines_is_renamed(tmp_path) -> None:
    """Two hosts' crontabs into one folder: the second's backup takes its file's name in front,
    and stderr says so; validate then accepts the folder (it refuses a name defined twice)."""
    out = tmp_path / "schedules"
    for host in ("web01", "web02"):
        (tmp_path / host).write_text("0 2 * * * /usr/local/bin/backup.sh\n")
        done = cli("import", "crontab", str(tmp_path / host), "--timezone", "UTC", "--misfire",
                   "skip", "-o", str(out))  # fmt: skip
        assert done.returncode == 0
    assert (f"{tmp_path / 'web02'}:1: warning: schedule name 'backup' is already defined in "
            f"{out / 'web01.toml'}") in done.stderr  # fmt: skip
    assert list(tomllib.loads((out / "web02.toml").read_text())) == ["web02-backup"]
    assert cli("validate", str(out)).returncode == 0
    (out / "web01.toml").unlink()
    clean = cli("import", "crontab", str(tmp_path / "web02"), "--timezone", "UTC", "--misfire",
                "skip", "-o", str(out))  # fmt: skip
    assert "already defined" not in clean.stderr
    assert list(tomllib.loads((out / "web02.toml").read_text())) == ["backup"]


def test_the_host_zone_changes_what_cronie_runs_for_a_cron_tz_job(tmp_path) -> None:
    """cronie steps by the host's clock: a CRON_TZ=America/New_York job at 20:30 on a
    Europe/Berlin host runs a second time when Berlin springs forward (03:00 CEST, 21:00 in New
    York), because cronie then runs the fixed-time jobs of each skipped Berlin minute. --compare
    simulates cronie in --timezone, the host's zone, so it shows that run, marked."""
    doc = DOCS.read_text()
    crontab_text = re.search(r"```crontab\n(CRON_TZ=America/New_York\n.*?)```", doc, re.S)[1]
    (tmp_path / "ny.crontab").write_text(crontab_text)
    command = re.search(r"```sh\n(cronkeeper import crontab ny\.crontab [^\n]*)\n```", doc)[1]
    done = cli(*command.split()[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = re.search(r"shows, among its rows:\n\n```\n(.*?)```", doc, re.S)[1]
    assert shown in done.stdout
    assert "DST 2027-03-28 in Europe/Berlin, cronie's zone (CET -> CEST):" in done.stdout
    assert " ! 2027-03-27T21:00:00-04:00    -" in done.stdout
    assert done.stdout.rstrip().endswith("1 differing instant")


EXTENSIONS = """\
0 0 L * * /usr/local/bin/month-end
0 9 * * 5L /usr/local/bin/last-friday
0 9 * * mon#2 /usr/local/bin/second-monday
H 6 * * * /usr/local/bin/hashed
H(0-99) 6 * * * /usr/local/bin/hashed-and-bad
0 0 L * 1#1 /usr/local/bin/both
#0 0 L * * /usr/local/bin/disabled-month-end
30 4 * * thu /usr/local/bin/plain
"""


def test_h_l_and_hash_are_refused_in_crontab_lines_and_say_why() -> None:
    """cron's grammar has no H, L or #: cron refused such a line, so it never ran, and the
    importer leaves it out (saying so) rather than writing a schedule that would now run."""
    result = crontab.convert(EXTENSIONS, source="ext.crontab", timezone="UTC", misfire="skip",
                             owner=None, system=False)  # fmt: skip
    left = {p.where: p.message for p in result.problems if p.left_out}
    why = "not in cron's grammar: cron refuses this line (it never ran)"
    assert set(left) == {f"ext.crontab:{n}" for n in range(1, 7)}
    assert all(why in message for message in left.values()), left
    assert "'L' (the last day or weekday of a month) is" in left["ext.crontab:1"]
    assert "'#' (the n-th weekday) is" in left["ext.crontab:3"]
    assert "'H' (a value hashed from a schedule's name) is" in left["ext.crontab:5"]
    assert "'L' (the last day or weekday of a month) and '#' (the n-th weekday) are" in left[
        "ext.crontab:6"]
    assert [e.get("cron") for e in result.entries] == ["30 4 * * thu"]
    assert result.entries[0].get("description") is None  # the disabled line ended the comments
