"""The relay config and `cronkeeper validate --relay-config`: every problem at once, with file,
line and did-you-mean, in text and JSON; and the glob -> PostgreSQL regex translation the
claims rely on, checked against fnmatch in a real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
from fnmatch import fnmatchcase

import sqlalchemy as sa
from handlers_for_tests import cronkeeper_exe
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronkeeper.relay.config import glob_regex, globs_regex, load_relay_config

BAD = """\
name = "main"
lese = "30s"

[targets.celery-main]
kind = "celery"
broker = "amqp://guest:guest@127.0.0.1:5672//"
confirm_timout = "5s"

[targets.rq-main]
kind = "rqq"

[[routes]]
tasks = ["billing.*"]
target = "celery-man"

[[routes]]
schedules = ["nightly-*"]
target = "celery-main"
queu = "x"

[[routes]]
target = "celery-main"
"""


def _validate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([cronkeeper_exe(), "validate", *args], capture_output=True, text=True,
                          timeout=60)


def test_every_problem_with_file_line_and_did_you_mean(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text(BAD)
    result = _validate("--relay-config", str(path))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    expected = [
        f"error: {path}:2: unknown key 'lese' (did you mean 'lease'?)",
        f"error: {path}:7: target 'celery-main': unknown key 'confirm_timout' (did you mean 'confirm_timeout'?)",
        f"error: {path}:10: target 'rq-main': unknown kind 'rqq' (did you mean 'rq'?)",
        f"error: {path}:14: route 1: no target named 'celery-man' (did you mean 'celery-main'?)",
        f"error: {path}:19: route 2: unknown key 'queu' (did you mean 'queue'?)",
    ]
    for line in expected:
        assert line in lines, (line, result.stdout)
    assert any(f"{path}:21: route 3: give 'tasks' or 'schedules'" in x for x in lines)
    assert "Traceback" not in result.stderr


def test_json_form(tmp_path):
    path = tmp_path / "relay.toml"
    path.write_text(BAD)
    result = _validate("--relay-config", str(path), "--format", "json")
    doc = json.loads(result.stdout)
    assert result.returncode == 1 and doc["valid"] is False
    first = doc["errors"][0]
    assert first == {"file": str(path), "line": 2, "schedule": None,
                     "message": "unknown key 'lese' (did you mean 'lease'?)", "severity": "error"}


def test_valid_config_with_schedules_and_a_routed_command_schedule(tmp_path):
    schedules = tmp_path / "schedules"
    schedules.mkdir(mode=0o755)
    (schedules / "a.toml").write_text(
        '[backup]\ncron = "0 3 * * *"\ntimezone = "UTC"\nmisfire = "skip"\n'
        'command = ["/bin/true"]\nowner = "ops"\n'
        '[invoices]\ncron = "0 4 * * *"\ntimezone = "UTC"\nmisfire = "skip"\n'
        'task = "billing.send"\nowner = "billing"\n')
    (schedules / "a.toml").chmod(0o644)
    good = tmp_path / "good.toml"
    good.write_text('[targets.c]\nkind = "celery"\nbroker = "amqp://127.0.0.1//"\n\n'
                    '[[routes]]\ntasks = ["billing.*"]\ntarget = "c"\n')
    assert _validate("--relay-config", str(good), str(schedules)).returncode == 0
    assert _validate("--relay-config", str(good)).returncode == 0  # schedule paths optional
    greedy = tmp_path / "greedy.toml"
    greedy.write_text('[targets.c]\nkind = "celery"\nbroker = "amqp://127.0.0.1//"\n\n'
                      '[[routes]]\ntasks = ["*"]\ntarget = "c"\n')
    result = _validate("--relay-config", str(greedy), str(schedules))
    assert result.returncode == 1
    assert f"{greedy}:5: schedule 'backup': route 1 would relay this schedule, but it runs a " \
           "command" in result.stdout


def test_unreadable_and_broken_files_are_messages_not_tracebacks(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text('[targets.c\nkind = "celery"\n')
    result = _validate("--relay-config", str(broken))
    assert result.returncode == 1 and f"{broken}:1: TOML syntax" in result.stdout
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    result = _validate("--relay-config", str(binary))
    assert result.returncode == 1 and "not UTF-8" in result.stdout
    missing = _validate("--relay-config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_config_values():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        fh.write('lease = "30s"\n[targets.c]\nkind = "celery"\nbroker = "redis://x"\n'
                 '[[routes]]\ntasks = ["a.*", "b"]\nschedules = ["n-*"]\ntarget = "c"\nqueue = "q"\n'
                 '[[routes]]\ntasks = ["*"]\ntarget = "c"\n')
    config = load_relay_config(fh.name).config
    assert config is not None and config.lease == 30
    assert config.route_for("a.x", "n-1").position == 0
    assert config.route_for("a.x", "other").position == 1  # first match wins, in order
    assert config.routes[0].task_regex == "^(?:a\\..*|b)$"


GLOB_CHARS = st.sampled_from(list("ab.*?[]!-^\\$()|+{}_/é"))
NAME_CHARS = st.sampled_from(list("ab.[]!-^\\$()|+{}_/é*?"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(glob=st.text(GLOB_CHARS, max_size=8), names=st.lists(st.text(NAME_CHARS, max_size=8),
                                                            min_size=1, max_size=6))
def test_glob_regex_matches_what_fnmatch_matches_in_postgresql(engine, glob, names):
    regex = globs_regex((glob,))
    with engine.connect() as conn:
        got = conn.execute(sa.text("SELECT n ~ :r FROM unnest(CAST(:names AS text[])) AS n"),
                           {"r": regex, "names": names}).scalars().all()
    assert got == [fnmatchcase(n, glob) for n in names], (glob, glob_regex(glob))


def test_relay_command_refuses_bad_config_and_unloadable_app_with_messages(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    result = subprocess.run([cronkeeper_exe(), "relay", "--config", str(bad),
                             "--metrics-address", "off"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and f"{bad}:2: unknown key 'lese'" in result.stderr
    assert "Traceback" not in result.stderr
    app = tmp_path / "app.toml"
    app.write_text('[targets.c]\nkind = "celery"\napp = "no_such_module_here:app"\n'
                   '[[routes]]\ntasks = ["*"]\ntarget = "c"\n')
    result = subprocess.run([cronkeeper_exe(), "relay", "--config", str(app),
                             "--metrics-address", "off"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "cannot load app 'no_such_module_here:app': ModuleNotFoundError" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_broker_url_celery_has_no_transport_for_is_refused_at_start(tmp_path):
    """``broker = "amqqp://..."`` (a typo) passed validate and started the relay, whose every
    publish then failed (kombu's KeyError), with no word in the log, until each job was a dead
    letter. Now validate and relay refuse it; so does relay for an app whose broker URL is."""
    import os

    url = tmp_path / "url.toml"
    url.write_text('[targets.c]\nkind = "celery"\nbroker = "amqqp://guest:guest@127.0.0.1:5672//"\n'
                   '[[routes]]\ntasks = ["*"]\ntarget = "c"\n')
    result = _validate("--relay-config", str(url))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{url}:3: target 'c': broker: no such Celery transport 'amqqp'" in result.stdout
    result = subprocess.run([cronkeeper_exe(), "relay", "--config", str(url),
                             "--metrics-address", "off"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no such Celery transport 'amqqp'" in result.stderr
    assert "Traceback" not in result.stderr
    (tmp_path / "typo_app.py").write_text(
        "from celery import Celery\napp = Celery('t', broker='amqqp://127.0.0.1//')\n")
    app = tmp_path / "app.toml"
    app.write_text('[targets.c]\nkind = "celery"\napp = "typo_app:app"\n'
                   '[[routes]]\ntasks = ["*"]\ntarget = "c"\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                                       os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([cronkeeper_exe(), "relay", "--config", str(app),
                             "--metrics-address", "off"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 1, result.stderr
    assert "target c: unusable broker URL: KeyError" in result.stderr
    assert "No such transport: amqqp" in result.stderr and "Traceback" not in result.stderr


def test_claims_follow_task_and_schedule_routes(engine, schema, tmp_path):
    """The relay's claim takes exactly the jobs its routes match (schedule globs, task globs,
    both); the worker's claim takes exactly the others once the routes are registered."""
    import cronkeeper
    from cronkeeper.db import outbox_claims as db
    from cronkeeper.db import relay_routes as db_relay

    path = tmp_path / "r.toml"
    path.write_text('[targets.c]\nkind = "celery"\nbroker = "amqp://x//"\n'
                    '[[routes]]\nschedules = ["nightly-*"]\ntarget = "c"\n'
                    '[[routes]]\ntasks = ["billing.*"]\nschedules = ["b?"]\ntarget = "c"\n')
    config = load_relay_config(str(path)).config
    rows = [("x", "nightly-a", True), ("x", "daily", False), ("billing.y", "b1", True),
            ("billing.y", "b12", False), ("billing.y", None, False), ("x", None, False)]
    with engine.begin() as conn:
        for i, (task, schedule, _) in enumerate(rows):
            cronkeeper.enqueue(conn, task, {}, key=f"k{i}", schema=schema)
            conn.execute(sa.text("UPDATE outbox SET schedule = :s WHERE idempotency_key = :k"),
                         {"s": schedule, "k": f"k{i}"})
        db_relay.relay_routes_register(conn, relay="r", routes=[
            db_relay.RouteRow(r.position, r.target, r.tasks and list(r.tasks),
                              r.schedules and list(r.schedules), r.task_regex, r.schedule_regex)
            for r in config.routes])
    routes = db.Routes(tuple(r.task_regex for r in config.routes),
                       tuple(r.schedule_regex for r in config.routes))
    with engine.begin() as conn:
        relayed = db.outbox_claim(conn, worker_id="relay", limit=100, lease_margin=0,
                                  routes=routes, lease=60)
        worked = db.outbox_claim(conn, worker_id="worker", limit=100, lease_margin=5)
    expected = {f"k{i}" for i, (_, _, routed) in enumerate(rows) if routed}
    assert {j.key for j in relayed} == expected
    assert {j.key for j in worked} == {f"k{i}" for i in range(len(rows))} - expected
    for job in relayed:  # and the Python routing agrees with the SQL one
        assert config.route_for(job.task, job.schedule) is not None
