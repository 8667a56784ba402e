"""`cronkeeper import celery-beat` (issue 11, SPEC §12) on real Celery app modules, imported by
the real command in a subprocess (as `celery -A` would, from the current directory)."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest
from handlers_for_tests import cronkeeper_exe

DOCS = Path(__file__).resolve().parent.parent / "docs" / "import.md"

APP = '''
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, schedule, solar

app = Celery("shop", broker="memory://")
app.conf.timezone = "America/New_York"


@app.task(name="shop.restock")
def restock(warehouse, sku, quantity=1, **extra):
    return warehouse


@app.task(name="shop.spread")
def spread(*items):
    return items


# solar() needs the ephem package to compute; the importer refuses it before computing
# anything, so a real solar instance is built without ephem.
sunset = solar.__new__(solar)
sunset.event, sunset.lat, sunset.lon = "sunset", 40.7, -74.0


class EveryFullMoon(schedule):
    pass


app.conf.beat_schedule = {
    "restock": {"task": "shop.restock", "schedule": crontab(minute=0, hour="*/4"),
                "args": ("nyc", "sku-1"), "kwargs": {"quantity": 5, "note": "x"},
                "options": {"queue": "stock", "priority": 3, "expires": 60}},
    "every-weekday-noon": {"task": "shop.report", "schedule": crontab(minute=0, hour=12,
                           day_of_week="mon-fri", month_of_year="1-6")},
    "set-minutes": {"task": "shop.poll", "schedule": crontab(minute={0, 30}, hour=[1, 2])},
    "odd-days": {"task": "shop.audit", "schedule": crontab(minute=15, hour=3,
                 day_of_month="*/2", day_of_week="sun")},
    "first-monday": {"task": "shop.monthly", "schedule": crontab(minute=0, hour=7,
                     day_of_week=1, day_of_month="1-7")},
    "hour-only": {"task": "shop.busy", "schedule": crontab(hour=7)},
    "Cache Warm!": {"task": "shop.warm", "schedule": timedelta(minutes=5)},
    "seconds": {"task": "shop.tick", "schedule": 90.0},
    "half-second": {"task": "shop.fast", "schedule": 0.5},
    "interval-object": {"task": "shop.hourly", "schedule": schedule(timedelta(hours=1))},
    "sunset": {"task": "shop.lights", "schedule": sunset},
    "custom": {"task": "shop.moon", "schedule": EveryFullMoon(timedelta(days=29))},
    "positional-unknown": {"task": "shop.unregistered", "schedule": 60, "args": [1]},
    "star-args": {"task": "shop.spread", "schedule": 60, "args": [1, 2]},
    "not-json": {"task": "shop.warm", "schedule": 60, "kwargs": {"when": timedelta(1)}},
    "null-kwarg": {"task": "shop.warm", "schedule": 60, "kwargs": {"limit": None}},
    "broken": "not an entry",
}
'''


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None):
    return subprocess.run([cronkeeper_exe(), *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)  # fmt: skip


def write_module(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    root = tmp_path_factory.mktemp("shop")
    write_module(root, "shopapp", APP)
    done = cli("import", "celery-beat", "shopapp:app", "--misfire", "catch_up", "--owner", "shop",
               "-o", "out", cwd=root)  # fmt: skip
    return done, root, root / "out"


def test_beat_schedule_converted_and_valid(shop) -> None:
    done, root, out = shop
    assert done.returncode == 1, done.stderr
    doc = tomllib.loads((out / "shopapp-app.toml").read_text())
    assert list(doc) == ["restock", "every-weekday-noon", "set-minutes", "odd-days", "hour-only",
                         "cache-warm", "seconds", "interval-object"]  # fmt: skip
    assert cli("validate", "out", cwd=root).returncode == 0
    restock = doc["restock"]
    assert restock["cron"] == "0 */4 * * *" and restock["timezone"] == "America/New_York"
    assert restock["task"] == "shop.restock" and restock["misfire"] == "catch_up"
    # positional args bound to the task's parameter names; **extra flattened into the payload
    assert restock["payload"] == {"warehouse": "nyc", "sku": "sku-1", "quantity": 5, "note": "x"}
    assert doc["every-weekday-noon"]["cron"] == "0 12 * 1-6 mon-fri"
    assert doc["set-minutes"]["cron"] == "0,30 1-2 * * *"  # from Celery's expanded sets
    assert doc["odd-days"]["cron"] == "15 3 */2 * sun"  # '*/2' keeps cronie's AND of the days
    assert doc["hour-only"]["cron"] == "* 7 * * *"
    assert doc["cache-warm"]["every"] == "5m" and doc["seconds"]["every"] == "90s"
    assert doc["interval-object"]["every"] == "1h"
    assert all(d["owner"] == "shop" for d in doc.values())
    # no result backend: the relay cannot learn that a run finished, so beat's way is kept
    assert all(d["overlap"] == "allow" for d in doc.values())
    # the file's header says, whole, how cronkeeper differs from beat
    text = (out / "shopapp-app.toml").read_text()
    for line in ("# Differences from Celery beat, for every schedule below:",
                 "# - each schedule emits a job whose task is the Celery task name",
                 "# - beat ran a task whenever it was due, even while the previous run was busy.",
                 "# - beat forgot runs missed while it was down;"):
        assert line in text, line


def test_refusals_and_warnings_name_the_entry_and_the_reason(shop) -> None:
    done, _, _ = shop
    err = done.stderr
    left_out = {
        "first-monday": "Celery fires only on days matching both",
        "half-second": "interval of 0.5s",
        "sunset": "solar schedule (sunset)",
        "custom": "schedule EveryFullMoon: a custom schedule class",
        "positional-unknown": "task 'shop.unregistered' is not registered",
        "star-args": "takes *items",
        "not-json": "kwargs are not JSON",
        "null-kwarg": "payload.limit is None: TOML (and so a schedule file) has no null",
        "broken": "not a beat entry",
    }
    for entry, reason in left_out.items():
        assert re.search(rf"^entry {re.escape(entry)}: .*{re.escape(reason)}", err, re.M), entry
    assert "entry restock: warning: option expires=60" in err
    assert "entry restock: warning: option priority=3" in err
    assert "entry hour-only: warning: minute is '*' with hour '7'" in err
    assert "8 schedules converted, 9 left out" in err


def test_relay_config_is_suggested_per_queue(shop) -> None:
    _, _, out = shop
    relay = tomllib.loads((out / "shopapp-app.relay.toml.example").read_text())
    assert relay["targets"] == {"celery": {"kind": "celery", "app": "shopapp:app"}}
    routes = relay["routes"]
    assert routes[0] == {"schedules": ["restock"], "target": "celery", "queue": "stock"}
    assert routes[1]["target"] == "celery" and "queue" not in routes[1]
    assert sorted(routes[0]["schedules"] + routes[1]["schedules"]) == sorted(
        tomllib.loads((out / "shopapp-app.toml").read_text()))


def test_same_app_same_output(shop) -> None:
    _, root, out = shop
    again = cli("import", "celery-beat", "shopapp:app", "--misfire", "catch_up", "--owner",
                "shop", cwd=root)  # fmt: skip
    assert again.stdout == (out / "shopapp-app.toml").read_text()


def test_django_style_settings_through_the_app_config(tmp_path) -> None:
    """Django projects keep CELERY_BEAT_SCHEDULE in settings and load them with
    config_from_object(..., namespace="CELERY"); a plain settings module stands in for
    django.conf.settings (the same lookup)."""
    write_module(tmp_path, "settings", '''
        from celery.schedules import crontab
        CELERY_TIMEZONE = "Europe/Paris"
        CELERY_BEAT_SCHEDULE = {"purge": {"task": "app.purge", "schedule": crontab(0, 4)}}
    ''')
    write_module(tmp_path, "proj", '''
        from celery import Celery
        app = Celery("proj")
        app.config_from_object("settings", namespace="CELERY")
    ''')
    done = cli("import", "celery-beat", "proj:app", "--misfire", "skip", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout)["purge"] | {} == {
        "cron": "0 4 * * *", "timezone": "Europe/Paris", "misfire": "skip", "overlap": "allow",
        "task": "app.purge", "description": "Celery beat entry 'purge'"}


def test_overlap_follows_whether_the_app_stores_results(tmp_path) -> None:
    """With a result backend the relay learns when a run finished, so cronkeeper's default
    overlap = "skip" is kept; a task that ignores its result (task or app setting) gets beat's
    "allow", with a comment saying why. Reading the configuration connects to nothing."""
    write_module(tmp_path, "stored", '''
        from celery import Celery
        app = Celery("s", broker="memory://", backend="redis://127.0.0.1:1/0")

        @app.task(name="s.quiet", ignore_result=True)
        def quiet():
            pass

        app.conf.beat_schedule = {"kept": {"task": "s.kept", "schedule": 60},
                                  "quiet": {"task": "s.quiet", "schedule": 60}}
    ''')
    done = cli("import", "celery-beat", "stored:app", "--misfire", "skip", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    doc = tomllib.loads(done.stdout)
    assert "overlap" not in doc["kept"] and doc["quiet"]["overlap"] == "allow"
    why = done.stdout.split('["quiet"]')[0].rsplit("\n# Celery beat entry", 1)[1]
    assert "no result is stored for this task" in why
    write_module(tmp_path, "ignoring", '''
        from celery import Celery
        app = Celery("i", broker="memory://", backend="redis://127.0.0.1:1/0")
        app.conf.task_ignore_result = True
        app.conf.beat_schedule = {"t": {"task": "i.t", "schedule": 60}}
    ''')
    done = cli("import", "celery-beat", "ignoring:app", "--misfire", "skip", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout)["t"]["overlap"] == "allow"


@pytest.mark.parametrize(
    ("conf", "zone_arg", "zone"),
    [("", None, "UTC"), ("app.conf.enable_utc = False", "Asia/Tokyo", "Asia/Tokyo"),
     ("app.conf.enable_utc = False\napp.conf.timezone = 'Europe/Oslo'", "Asia/Tokyo", "Europe/Oslo")],
)
def test_the_apps_timezone_and_enable_utc_decide_the_zone(tmp_path, conf, zone_arg, zone) -> None:
    write_module(tmp_path, "zoneapp", f'''
from celery import Celery
app = Celery("z")
{conf}
app.conf.beat_schedule = {{"t": {{"task": "a.b", "schedule": 3600}}}}
''')
    args = ["import", "celery-beat", "zoneapp:app", "--misfire", "skip"]
    done = cli(*args, *(["--timezone", zone_arg] if zone_arg else []), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout)["t"]["timezone"] == zone


def test_local_time_app_without_timezone_is_unusable(tmp_path) -> None:
    write_module(tmp_path, "localapp", '''
from celery import Celery
app = Celery("l")
app.conf.enable_utc = False
app.conf.beat_schedule = {"t": {"task": "a.b", "schedule": 3600}}
''')
    done = cli("import", "celery-beat", "localapp:app", "--misfire", "skip", "-o", "out",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2 and "pass --timezone" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("module", "spec", "message"),
    [
        ("raise RuntimeError('database is down')", "failing:app", "RuntimeError: database is down"),
        ("import sys\nsys.exit(3)", "failing:app", "SystemExit: 3"),
        ("import no_such_module_anywhere", "failing:app", "ModuleNotFoundError"),
        ("app = 42", "failing:app", "is a int, not a Celery app"),
        ("x = 1", "failing:app", "has no attribute 'app'"),
        ("x = 1", "nowhere_module:app", "cannot import 'nowhere_module'"),
    ],
)
def test_a_module_that_fails_exits_2_and_writes_nothing(tmp_path, module, spec, message) -> None:
    (tmp_path / "failing.py").write_text(module + "\n")
    done = cli("import", "celery-beat", spec, "--misfire", "skip", "-o", "out", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == "" and not (tmp_path / "out").exists()


def test_docs_example_and_compare_against_celery_itself(tmp_path) -> None:
    """docs/import.md's Celery app and commands, verbatim; --compare runs Celery's own is_due:
    on the spring-forward day beat runs the 02:30 entry at 03:30 CEST, cronkeeper at 03:00."""
    doc = DOCS.read_text()
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "celery.py").write_text(re.search(r"```python\n(.*?)```", doc, re.S)[1])
    command = re.search(r"```sh\n(cronkeeper import celery-beat [^\n]*-o schedules/)\n```", doc)[1]
    done = cli(*command.split()[1:], cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    stderr = re.search(r"and exits 1:\n\n```\n(.*?)```", doc, re.S)[1]
    for line in stderr.splitlines():
        assert line in done.stderr
    schedules = tomllib.loads((tmp_path / "schedules" / "proj-celery-app.toml").read_text())
    assert list(schedules) == ["nightly-invoices", "pricing-cache-warm", "metrics-flush"]
    assert schedules["nightly-invoices"]["payload"] == {"region": "eu", "dry_run": False}
    assert (tmp_path / "schedules" / "proj-celery-app.relay.toml.example").exists()
    assert cli("validate", "schedules", cwd=tmp_path).returncode == 0
    compare = re.search(r"```sh\n(cronkeeper import celery-beat [^\n]*--compare[^\n]*)\n```", doc)[1]
    shown = cli(*compare.split()[1:], cwd=tmp_path)
    assert shown.returncode == 1, shown.stderr
    assert " ! -                            2027-03-28T03:00:00+02:00" in shown.stdout
    assert " ! 2027-03-28T03:30:00+02:00    -" in shown.stdout
    assert "2 differing instants" in shown.stdout


def test_compare_of_a_very_frequent_entry_says_how_far_it_got(tmp_path) -> None:
    write_module(tmp_path, "fast", '''
from celery import Celery
app = Celery("f")
app.conf.beat_schedule = {"tick": {"task": "a.b", "schedule": 1.0}}
''')
    done = cli("import", "celery-beat", "fast:app", "--misfire", "skip", "--compare", "--from",
               "2026-12-01T00:00:00Z", "--days", "30", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "(compared up to 2026-12-03T" in done.stdout
    assert done.stdout.rstrip().endswith("0 differing instants")  # no cut-off tail shown as differing


HOST_LOCAL_APP = '''
from celery import Celery
from celery.schedules import crontab

app = Celery("reports", broker="memory://")
app.conf.enable_utc = False  # beat reads the schedule in the host's local time; no timezone set
app.conf.beat_schedule = {
    "nightly-rollup": {"task": "reports.rollup", "schedule": crontab(minute=0, hour=23)},
    "morning-digest": {"task": "reports.digest", "schedule": crontab(minute=30, hour=7,
                                                                     day_of_week="mon-fri")},
}
'''


@pytest.mark.parametrize("importer_zone", ["Asia/Tokyo", "America/Los_Angeles"])
def test_compare_runs_beat_in_the_schedules_zone_not_the_importers(tmp_path, importer_zone) -> None:
    """An app on its host's local time, imported with --timezone Europe/Berlin by someone whose
    own zone is another: beat's fires are simulated in Europe/Berlin, where the schedule was
    written, so they equal cronkeeper's for a year holding both DST changes: no '!' at all."""
    write_module(tmp_path, "reports", HOST_LOCAL_APP)
    env = {**os.environ, "TZ": importer_zone}
    done = cli("import", "celery-beat", "reports:app", "--misfire", "skip", "--timezone",
               "Europe/Berlin", "--compare", "--from", "2026-12-01T00:00:00Z", cwd=tmp_path,
               env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert 'nightly-rollup: cron "0 23 * * *" in Europe/Berlin' in out
    assert "   2026-12-01T23:00:00+01:00    2026-12-01T23:00:00+01:00" in out
    assert "DST 2027-03-28 in Europe/Berlin (CET -> CEST)" in out
    assert not [line for line in out.splitlines() if line.startswith(" !")], out
    assert "365 celery beat fires, 365 cronkeeper fires in 365 days; 0 instants differ" in out
    assert out.rstrip().endswith("2 entries compared from 2026-12-01T00:00:00Z for 365 days; "
                                 "0 differing instants")  # fmt: skip


def test_two_apps_into_one_folder_keep_names_unique(tmp_path) -> None:
    """Two apps' beat schedules in one folder, both with a "cleanup" entry: the second app's
    takes its file's name in front, stderr says so, and the folder validates."""
    for name in ("billing", "shipping"):
        write_module(tmp_path, name, f'''
from celery import Celery
app = Celery("{name}", broker="memory://")
app.conf.beat_schedule = {{"cleanup": {{"task": "{name}.cleanup", "schedule": 3600}}}}
''')
        done = cli("import", "celery-beat", f"{name}:app", "--misfire", "skip", "-o", "out",
                   cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert ("entry cleanup: warning: schedule name 'cleanup' is already defined in "
            "out/billing-app.toml, and names are unique across a directory: named "
            "'shipping-app-cleanup'") in done.stderr  # fmt: skip
    assert list(tomllib.loads((tmp_path / "out" / "shipping-app.toml").read_text())) == [
        "shipping-app-cleanup"]
    relay = tomllib.loads((tmp_path / "out" / "shipping-app.relay.toml.example").read_text())
    assert relay["routes"][0]["schedules"] == ["shipping-app-cleanup"]
    assert cli("validate", "out", cwd=tmp_path).returncode == 0
