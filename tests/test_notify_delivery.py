"""The sender delivers what the events noted, at least once, to real receivers on loopback
(docs/notifications.md): a webhook (JSON, signature verified), Slack's shape, e-mail over a real
SMTP session (plain, STARTTLS with AUTH, SMTPS), Apprise; retried with backoff through a
receiver that answers 503 three times; a refusal for good is not retried, and a notification
that cannot be sent is logged and counted, never notified about in turn; rules pick the sinks;
a sender whose lease ran out loses nothing and repeats at most one sink."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from daemon_harness import wait_for
from notify_receivers import HttpReceiver, SmtpReceiver, self_signed
from prometheus_client import CollectorRegistry

from cronkeeper import metrics
from cronkeeper.db import outbox_claims as claims
from cronkeeper.db import outbox_endings as endings
from cronkeeper.notify.config import load_notify_config
from cronkeeper.notify.sender import Sender

RETRY_FAST = 'max_attempts = 10\nretry_for = "1s"\nbackoff = { base = "0.05s", factor = 2, max = "0.2s" }\n'


@pytest.fixture
def receiver():
    r = HttpReceiver()
    yield r
    r.close()


@pytest.fixture
def counted():
    """This process's metrics on a registry of the test's own."""
    previous = metrics._current
    metrics._current = metrics.Metrics(CollectorRegistry(), kind="worker")
    yield metrics._current
    metrics._current = previous


def value(m: metrics.Metrics, name: str, **labels) -> float:
    return m.registry.get_sample_value(name, labels) or 0.0


def config(tmp_path: Path, text: str):
    path = tmp_path / "notify.toml"
    path.write_text(text)
    result = load_notify_config(str(path))
    assert result.errors == [], result.errors
    return result.config


@pytest.fixture
def senders(engine, schema):
    started: list[Sender] = []

    def start(cfg, *, sender_id="s1", environ=None, web_url=None) -> Sender:
        sender = Sender(engine, cfg, schema=schema, sender_id=sender_id, web_url=web_url,
                        environ=environ or {})
        sender.start()
        started.append(sender)
        return sender

    yield start
    for sender in started:
        sender.stopping.set()
        sender.poke()
        sender.thread.join(10)


def dead_letter(engine, *, schedule="nightly-invoices", task="billing.send_invoices",
                owner="team-billing", error="exit code 1", output: bytes | None = None) -> str:
    """A job of ``schedule`` claimed and dead-lettered by a worker's statement (noting it)."""
    key = f"{schedule or task}@2026-03-08T07:00:00Z#{datetime.now(UTC).timestamp()}"
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox (idempotency_key, schedule, task, owner, max_attempts) "
            "VALUES (%(k)s, %(s)s, %(t)s, %(o)s, 1)", {"k": key, "s": schedule, "t": task,
                                                        "o": owner})
        [job] = claims.outbox_claim(conn, worker_id="w1", limit=1, lease_margin=30)
        endings.outbox_fail(conn, worker_id="w1", note=True, keep_output=True, failures=[
            endings.Failure(job.id, job.attempt, "dead", 0.0, error, "dead", output=output,
                            last_error=error)])
    return key


def note_rows(engine) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.exec_driver_sql(
            "SELECT id, event, state, tries, sent_to, failed_to, last_error FROM notifications "
            "ORDER BY id")]


def test_a_dead_letter_reaches_a_webhook_signed_with_every_field(engine, tmp_path, receiver,
                                                                 senders, counted):
    cfg = config(tmp_path, f"""
[sinks.pager]
kind = "webhook"
url = "{receiver.url}/hooks/cron"
secret_env = "HOOK_SECRET"

[[rules]]
sink = "pager"
""")
    key = dead_letter(engine, output=b"charging customer 42\nTraceback: boom\n")
    senders(cfg, environ={"HOOK_SECRET": "s3cret"}, web_url="http://ck.example:9480/")
    [request] = wait_for(lambda: receiver.posts("/hooks/cron"), 10, "the webhook")
    expected = "sha256=" + hmac.new(b"s3cret", request.body, hashlib.sha256).hexdigest()
    assert request.headers["X-Cronkeeper-Signature"] == expected
    assert request.headers["Content-Type"].startswith("application/json")
    body = request.json()
    assert {k: body[k] for k in ("event", "schedule", "task", "owner", "key", "attempts",
                                 "error", "count", "window")} == {
        "event": "dead", "schedule": "nightly-invoices", "task": "billing.send_invoices",
        "owner": "team-billing", "key": key, "attempts": 1, "error": "exit code 1",
        "count": 1, "window": None}
    assert body["output_tail"] == "charging customer 42\nTraceback: boom"
    assert body["explain_url"] == f"http://ck.example:9480/explain/{key.replace('#', '%23')}"
    assert body["schedule_url"] == "http://ck.example:9480/schedules/nightly-invoices"
    assert isinstance(body["id"], int) and body["at"].endswith("Z")
    wait_for(lambda: note_rows(engine)[0]["state"] == "sent", 10, "the notification settled")
    assert note_rows(engine)[0]["sent_to"] == ["pager"]
    assert value(counted, "cronkeeper_notifications_sent_total", sink="pager", event="dead") == 1


def test_slack_gets_text_plus_blocks(engine, tmp_path, receiver, senders):
    cfg = config(tmp_path, """
[sinks.ops-slack]
kind = "slack"
url_env = "SLACK_URL"

[[rules]]
events = ["dead"]
sink = "ops-slack"
""")
    dead_letter(engine, error="exit code 3 <script>&", output=b"line ``` one\n")
    senders(cfg, environ={"SLACK_URL": receiver.url + "/services/T000/B000/XXXX"})
    [request] = wait_for(lambda: receiver.posts("/services/T000/B000/XXXX"), 10, "slack")
    body = request.json()
    assert body["text"].startswith("nightly-invoices: job nightly-invoices@")
    assert "is a dead letter after 1 attempt: exit code 3 <script>&" in body["text"]
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds[0] == "section" and kinds[-1] == "context"
    flat = json.dumps(body["blocks"])
    assert "exit code 3 &lt;script&gt;&amp;" in flat  # escaped for Slack's mrkdwn
    assert "<script>" not in flat
    assert "line `\\u200b`` one" in flat  # a backtick run cannot close the code block


def test_an_email_over_starttls_with_auth_and_another_over_smtps(engine, tmp_path, senders):
    cert, key_file = self_signed(tmp_path)
    starttls = SmtpReceiver(tls=(cert, key_file), users={"ck": "pw"})
    smtps = SmtpReceiver(tls=(cert, key_file), implicit=True)
    try:
        cfg = config(tmp_path, f"""
[sinks.mail]
kind = "email"
smtp = "{starttls.url()}"
from = "cronkeeper@example.com"
to = ["billing-oncall@example.com"]
to_owner = true
user_env = "SMTP_USER"
password_env = "SMTP_PASSWORD"
ca_file = "{cert}"

[sinks.mail-tls]
kind = "email"
smtp = "{smtps.url('smtps')}"
from = "cronkeeper@example.com"
to_owner = true
ca_file = "{cert}"

[[rules]]
sink = "mail"

[[rules]]
owners = ["*@example.com"]
sink = "mail-tls"
""")
        key = dead_letter(engine, owner="ops@example.com", output=b"disk full\n")
        senders(cfg, environ={"SMTP_USER": "ck", "SMTP_PASSWORD": "pw"})
        [mail] = wait_for(lambda: starttls.received, 15, "the mail over STARTTLS")
        assert mail.tls and mail.login == "ck"
        assert mail.recipients == ["billing-oncall@example.com", "ops@example.com"]
        message = mail.message
        assert message["Subject"] == "[cronkeeper] dead: nightly-invoices"
        assert message["From"] == "cronkeeper@example.com"
        assert message["Message-ID"].startswith("<cronkeeper.notification.")
        text = message.get_payload(decode=True).decode().replace("\r\n", "\n")
        assert f"key: {key}" in text and "disk full" in text and "error:\nexit code 1" in text
        [mail2] = wait_for(lambda: smtps.received, 15, "the mail over SMTPS")
        assert mail2.tls and mail2.recipients == ["ops@example.com"]
    finally:
        starttls.close()
        smtps.close()


def test_a_mail_sink_refuses_to_send_a_password_in_the_clear(engine, tmp_path, senders, counted):
    plain = SmtpReceiver()
    try:
        cfg = config(tmp_path, f"""
[sinks.mail]
kind = "email"
smtp = "{plain.url()}"
from = "cronkeeper@example.com"
to = ["a@example.com"]
user_env = "SMTP_USER"
password_env = "SMTP_PASSWORD"

[[rules]]
sink = "mail"
""")
        dead_letter(engine)
        senders(cfg, environ={"SMTP_USER": "ck", "SMTP_PASSWORD": "pw"})
        wait_for(lambda: note_rows(engine)[0]["state"] == "failed", 15, "the refusal")
        assert plain.received == []
        assert "refusing to send the password in the clear" in note_rows(engine)[0]["last_error"]
        assert value(counted, "cronkeeper_notifications_failed_total", sink="mail") == 1
    finally:
        plain.close()


def test_a_receiver_that_answers_503_three_times_gets_it_on_the_fourth_try(
        engine, tmp_path, receiver, senders, counted):
    receiver.answers = [503, 503, 503]
    cfg = config(tmp_path, f"""{RETRY_FAST}
[sinks.pager]
kind = "webhook"
url = "{receiver.url}/h"

[[rules]]
sink = "pager"
""")
    dead_letter(engine)
    senders(cfg)
    wait_for(lambda: note_rows(engine)[0]["state"] == "sent", 15, "the fourth try")
    row = note_rows(engine)[0]
    assert len(receiver.posts("/h")) == 4 and row["tries"] == 4
    assert len({r.body for r in receiver.posts("/h")}) == 1  # the same body each time
    assert value(counted, "cronkeeper_notifications_sent_total", sink="pager", event="dead") == 1
    assert value(counted, "cronkeeper_notifications_failed_total", sink="pager") == 0


def test_a_refusal_for_good_is_not_retried_and_is_counted_never_notified(
        engine, tmp_path, receiver, senders, counted, caplog):
    receiver.answers = [404]
    cfg = config(tmp_path, f"""{RETRY_FAST}
[sinks.pager]
kind = "webhook"
url = "{receiver.url}/gone"

[[rules]]
sink = "pager"
""")
    dead_letter(engine)
    with caplog.at_level(logging.ERROR, logger="cronkeeper.notify"):
        senders(cfg)
        wait_for(lambda: note_rows(engine)[0]["state"] == "failed", 10, "the refusal")
    assert len(receiver.posts()) == 1
    assert note_rows(engine)[0]["failed_to"] == ["pager"]
    assert value(counted, "cronkeeper_notifications_failed_total", sink="pager") == 1
    assert any(getattr(r, "action", "") == "notification_failed" for r in caplog.records)
    assert [n["event"] for n in note_rows(engine)] == ["dead"]  # nothing about the failure


def test_tries_spent_fail_it_for_good_and_it_is_counted(engine, tmp_path, receiver, senders,
                                                        counted):
    receiver.answers = [503] * 100
    cfg = config(tmp_path, f"""max_attempts = 3
retry_for = "0.2s"
backoff = {{ base = "0.05s", factor = 1, max = "0.05s" }}

[sinks.pager]
kind = "webhook"
url = "{receiver.url}/h"

[[rules]]
sink = "pager"
""")
    dead_letter(engine)
    senders(cfg)
    wait_for(lambda: note_rows(engine)[0]["state"] == "failed", 15, "giving up")
    assert note_rows(engine)[0]["tries"] >= 3
    assert value(counted, "cronkeeper_notifications_failed_total", sink="pager") == 1
    assert len(note_rows(engine)) == 1


def test_rules_pick_sinks_by_event_owner_schedule_and_task_and_each_sink_gets_it_once(
        engine, tmp_path, receiver, senders):
    cfg = config(tmp_path, f"""
[sinks.billing]
kind = "webhook"
url = "{receiver.url}/billing"

[sinks.ops]
kind = "webhook"
url = "{receiver.url}/ops"

[sinks.mail-only]
kind = "webhook"
url = "{receiver.url}/mail"

[[rules]]
events = ["dead", "recovered"]
owners = ["team-bill*"]
sink = "billing"

[[rules]]
schedules = ["nightly-*"]
sink = "billing"

[[rules]]
events = ["missed"]
sink = "ops"

[[rules]]
tasks = ["mail.*"]
sink = "mail-only"
""")
    dead_letter(engine)  # billing, twice matched: sent once
    dead_letter(engine, schedule=None, task="mail.send", owner=None)
    senders(cfg)
    wait_for(lambda: all(n["state"] == "sent" for n in note_rows(engine)), 10, "both settled")
    assert len(receiver.posts("/billing")) == 1 and len(receiver.posts("/mail")) == 1
    assert receiver.posts("/ops") == []
    assert receiver.posts("/mail")[0].json()["schedule"] is None


def test_a_sink_that_took_it_is_not_sent_to_again_when_another_is_retried(
        engine, tmp_path, receiver, senders):
    receiver.answers = []
    flaky = HttpReceiver(answers=[503, 503])
    try:
        cfg = config(tmp_path, f"""{RETRY_FAST}
[sinks.good]
kind = "webhook"
url = "{receiver.url}/good"

[sinks.flaky]
kind = "webhook"
url = "{flaky.url}/flaky"

[[rules]]
sink = "good"

[[rules]]
sink = "flaky"
""")
        dead_letter(engine)
        senders(cfg)
        wait_for(lambda: note_rows(engine)[0]["state"] == "sent", 15, "both sinks")
        assert len(receiver.posts("/good")) == 1 and len(flaky.posts("/flaky")) == 3
    finally:
        flaky.close()


def test_a_sender_that_stops_mid_send_loses_nothing_and_repeats_at_most_one_sink(
        engine, tmp_path, receiver, senders):
    """The first sender hangs in its send (the receiver holds the request) and stops renewing
    its lease, as a killed process would; the lease runs out and a second sender delivers.
    The receiver saw that sink's request twice at most, the other sink's once."""
    receiver.hold.set()
    other = HttpReceiver()
    try:
        cfg = config(tmp_path, f"""{RETRY_FAST}
[sinks.first]
kind = "webhook"
url = "{other.url}/first"
timeout = "1s"

[sinks.hangs]
kind = "webhook"
url = "{receiver.url}/hangs"
timeout = "1s"

[[rules]]
sink = "first"

[[rules]]
sink = "hangs"
""")
        dead_letter(engine)
        stuck = senders(cfg, sender_id="stuck")
        wait_for(lambda: receiver.posts("/hangs"), 10, "the hanging send")
        stuck.stopping.set()  # it stops after this send; its lease will run out
        receiver.hold.clear()
        receiver.released.set()
        with engine.begin() as conn:  # the lease runs out (not waited for: moved to the past)
            conn.exec_driver_sql("UPDATE notifications SET lease_expires_at = now() - "
                                 "interval '1 second' WHERE state = 'sending'")
        senders(cfg, sender_id="second")
        wait_for(lambda: note_rows(engine)[0]["state"] == "sent", 15, "the second sender")
        assert len(other.posts("/first")) == 1
        assert 1 <= len(receiver.posts("/hangs")) <= 2
    finally:
        other.close()


def test_apprise_delivers_through_its_url_and_its_failures_are_retried(engine, tmp_path,
                                                                      receiver, senders):
    receiver.answers = [503]
    cfg = config(tmp_path, f"""{RETRY_FAST}
[sinks.anything]
kind = "apprise"
url_env = "APPRISE_URL"

[[rules]]
sink = "anything"
""")
    dead_letter(engine)
    port = receiver.server.server_port
    senders(cfg, environ={"APPRISE_URL": f"json://127.0.0.1:{port}/apprise"})
    wait_for(lambda: note_rows(engine)[0]["state"] == "sent", 20, "apprise")
    posts = receiver.posts("/apprise")
    assert len(posts) == 2 and note_rows(engine)[0]["tries"] == 2
    body = posts[-1].json()
    assert body["title"] == "[cronkeeper] dead: nightly-invoices"
    assert "is a dead letter" in body["message"]
