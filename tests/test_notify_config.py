"""The notify config (docs/notifications.md) read with every problem at once, as validate prints
schedule files' (file:line, did-you-mean, JSON); rules pick sinks by event and globs; secrets
only by environment variable name; run and worker refuse a bad config before they start."""

from __future__ import annotations

import json
import subprocess

from handlers_for_tests import cronkeeper_exe

from cronkeeper.notify.config import environment_problems, heartbeat_url, load_notify_config
from cronkeeper.notify.model import Event

GOOD = """
heartbeat_url_env = "HC_URL"
heartbeat_interval = "30s"
max_attempts = 12
retry_for = "15m"
backoff = { base = "5s", factor = 3, max = "2m" }

[sinks.ops-slack]
kind = "slack"
url_env = "CRONKEEPER_SLACK_URL"

[sinks.pager]
kind = "webhook"
url = "http://127.0.0.1:8080/hooks/cron"
secret_env = "CRONKEEPER_HOOK_SECRET"

[sinks.billing-mail]
kind = "email"
smtp = "smtp://127.0.0.1:25"
from = "cronkeeper@example.com"
to = ["billing-oncall@example.com"]
to_owner = true

[[rules]]
events = ["dead", "missed", "recovered"]
owners = ["team-billing"]
sink = "billing-mail"

[[rules]]
schedules = ["nightly-*"]
tasks = ["billing.*"]
sink = "pager"

[[rules]]
sink = "ops-slack"
"""


def load(tmp_path, text):
    path = tmp_path / "notify.toml"
    path.write_text(text)
    return load_notify_config(str(path))


def test_the_documented_example_reads_whole(tmp_path):
    result = load(tmp_path, GOOD)
    assert result.diagnostics == ()
    cfg = result.config
    assert [s.name for s in cfg.sinks] == ["ops-slack", "pager", "billing-mail"]
    assert cfg.heartbeat_interval == 30 and cfg.max_attempts == 12 and cfg.retry_for == 900
    assert cfg.backoff == (5.0, 3.0, 120.0)
    assert [s.name for s in cfg.sinks_for("dead", "nightly-x", "billing.run", "team-billing")] == [
        "billing-mail", "pager", "ops-slack"]
    assert [s.name for s in cfg.sinks_for("missing", "nightly-x", "billing.run",
                                          "team-billing")] == ["pager", "ops-slack"]
    assert [s.name for s in cfg.sinks_for("dead", "other", "mail.send", None)] == ["ops-slack"]
    assert cfg.rules[2].events == frozenset(Event)  # no events: every event


def test_defaults_give_at_least_ten_tries_over_at_least_ten_minutes(tmp_path):
    cfg = load(tmp_path, "").config
    assert cfg.max_attempts >= 10 and cfg.retry_for >= 600
    assert cfg.heartbeat_interval == 60 and cfg.heartbeat_url is None


def test_every_problem_at_once_with_its_line_and_a_did_you_mean(tmp_path):
    result = load(tmp_path, """heartbeat_url = "ftp://x"
heartbet_interval = "30s"

[sinks.ops-slack]
kind = "slack"
url = "https://hooks.slack.com/services/T/B/secret"

[sinks.pager]
kind = "webhok"

[sinks.mail]
kind = "email"
smtp = "smtp://user:pw@127.0.0.1:25"
from = "not an address"
password = "hunter2"

[sinks.hook]
kind = "webhook"
url_env = "lower-case!"

[[rules]]
events = ["dead", "misssed"]
sink = "billing-mail"

[[rules]]
owners = []
sink = "hook"
""")
    assert result.config is None
    got = [(d.line, d.message) for d in result.errors]
    assert got == [
        (2, "unknown key 'heartbet_interval' (did you mean 'heartbeat_interval'?)"),
        (1, "heartbeat_url: expected an http:// or https:// URL, e.g. \"https://hc-ping.com/<uuid>\""),
        (6, "sink 'ops-slack': a slack URL holds the service's secret: give the name of the "
            "environment variable that holds it (url_env), never the URL"),
        (4, "sink 'ops-slack': missing key 'url_env' (the environment variable that holds the "
            "slack URL)"),
        (9, "sink 'pager': unknown kind 'webhok' (did you mean 'webhook'?)"),
        (15, "sink 'mail': secrets go by environment variable name: password_env = \"NAME\""),
        (13, "sink 'mail': smtp: expected smtp://HOST[:PORT] (STARTTLS when the server offers "
             "it) or smtps://HOST[:PORT], without a user or password (user_env, password_env)"),
        (14, "sink 'mail': from: expected an e-mail address"),
        (11, "sink 'mail': give 'to' (a list of addresses) and/or to_owner = true (the "
             "schedule's owner, when it is an address)"),
        (19, "sink 'hook': url_env: expected the name of an environment variable, e.g. "
             "\"CRONKEEPER_SLACK_URL\" (the secret itself never goes in this file)"),
        (22, "rule 1: unknown event 'misssed' (did you mean 'missed'?)"),
        (23, "rule 1: no sink named 'billing-mail'"),
        (26, "rule 2: owners: expected a non-empty list of glob strings, e.g. [\"team-*\"]"),
    ]


def test_hostile_input_is_a_message_never_a_traceback(tmp_path):
    for text in ("[sinks\n", "sinks = 3\nrules = 'x'\n", "[[rules]]\nsink = 1\nevents = 3\n",
                 "max_attempts = true\nbackoff = 5\n", "\x00\xff"):
        result = load(tmp_path, text)
        assert result.config is None and result.errors, text
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe")
    assert load_notify_config(str(tmp_path / "bin.toml")).errors[0].message == "not UTF-8 text"
    assert "cannot read" in load_notify_config(str(tmp_path / "nope.toml")).errors[0].message


def test_environment_problems_name_each_missing_variable(tmp_path):
    cfg = load(tmp_path, GOOD).config
    assert environment_problems(cfg, {}) == [
        "sink 'ops-slack': environment variable CRONKEEPER_SLACK_URL is not set",
        "sink 'pager': environment variable CRONKEEPER_HOOK_SECRET is not set",
        "heartbeat_url_env: environment variable HC_URL is not set"]
    env = {"CRONKEEPER_SLACK_URL": "not a url", "CRONKEEPER_HOOK_SECRET": "s",
           "HC_URL": "https://hc-ping.com/abc"}
    assert environment_problems(cfg, env) == [
        "sink 'ops-slack': CRONKEEPER_SLACK_URL is not an http:// or https:// URL"]
    assert heartbeat_url(cfg, env) == "https://hc-ping.com/abc"


def run_cli(*args, env=None):
    import os

    return subprocess.run([cronkeeper_exe(), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def test_validate_checks_a_notify_config_with_the_schedule_files_format(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[sinks.a]\nkind = "slak"\n')
    out = run_cli("validate", "--notify-config", str(bad))
    assert out.returncode == 1
    assert f"error: {bad}:2: sink 'a': unknown kind 'slak' (did you mean 'slack'?)" in out.stdout
    doc = json.loads(run_cli("validate", "--notify-config", str(bad), "--format", "json").stdout)
    assert doc["valid"] is False and doc["errors"][0]["line"] == 2
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    out = run_cli("validate", "--notify-config", str(good))
    assert out.returncode == 0, out.stdout
    assert "CRONKEEPER_SLACK_URL is not set here" in out.stdout  # a warning, not an error
    assert run_cli("validate", "--notify-config", str(tmp_path / "none.toml")).returncode == 2


def test_run_and_worker_refuse_a_bad_config_before_they_start(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[sinks.a]\nkind = "slack"\nurl_env = "UNSET_SLACK_URL_FOR_TEST"\n[[rules]]\n'
                   'sink = "a"\n')
    for command in (["worker"], ["run", "--schedules", str(tmp_path)]):
        out = run_cli(*command, "--notify-config", str(bad), "--database-url",
                      "postgresql://nobody@127.0.0.1:1/none")
        assert out.returncode == 2, out.stderr
        assert "UNSET_SLACK_URL_FOR_TEST is not set" in out.stderr
        assert "Traceback" not in out.stderr
