"""A sink that misbehaves never silences the others (docs/notifications.md, "Sending"): a webhook
whose port answers something that is not HTTP (an SSH server, a mail server behind a wrong
port), and an e-mail whose subject would hold a line break (a task name is any string an
application gave), are failures of that sink, retried, logged and counted, while every other
sink is told; the sender thread of the worker lives on. Real workers, a real PostgreSQL, real
receivers on loopback. And a bug of the sender's own is said once, not the end of it."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import psycopg
from daemon_harness import set_path, shared_postgres, spawn_json_worker, wait_for
from notify_receivers import HttpReceiver, SmtpReceiver
from test_notify_delivery import (  # noqa: F401 - senders: the fixture
    RETRY_FAST,
    config,
    dead_letter,
    note_rows,
    senders,
)

import cronkeeper
from cronkeeper.notify.heartbeat import Pinger


class NotHttp:
    """A TCP service that is not HTTP: it greets as an SSH server does, then closes."""

    def __init__(self, greeting: bytes = b"SSH-2.0-OpenSSH_9.6\r\n") -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.greeting = greeting
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(self.greeting)
                # Then read what the client sends until it hangs up, so that it fails on the
                # answer (BadStatusLine), not on a reset while still sending its request
                # (EPIPE): closing at once made the error depend on who was faster.
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    while conn.recv(65536):
                        pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def close(self) -> None:
        self.sock.close()


def two_sinks_toml(path: Path, wrong: str, good: str) -> Path:
    path.write_text(f"""max_attempts = 10
retry_for = "30s"
backoff = {{ base = "0.1s", factor = 2, max = "0.5s" }}

[sinks.wrong-port]
kind = "webhook"
url = "{wrong}/hook"
timeout = "2s"

[sinks.good]
kind = "webhook"
url = "{good}/hook"
timeout = "2s"

[[rules]]
sink = "wrong-port"

[[rules]]
sink = "good"
""")
    return path


def test_a_webhook_port_that_does_not_speak_http_silences_no_other_sink(tmp_path):
    pg = shared_postgres()
    schema = pg.new_schema()
    db = set_path(pg.connect(), schema)
    wrong, good = NotHttp(), HttpReceiver()
    notify = two_sinks_toml(tmp_path / "notify.toml", wrong.url, good.url)
    log = tmp_path / "w1.log"
    worker = spawn_json_worker(pg.url, schema, "wrong-port", "w1", log,
                               "--notify-config", str(notify))
    try:
        with psycopg.connect(pg.url) as app:
            app.execute(f'SET search_path TO "{schema}"')
            cronkeeper.enqueue(app, "permanent", {}, key="first", schema=schema)
        wait_for(lambda: good.posts("/hook"), 30, "the good sink told", alive=worker)
        wait_for(lambda: wrong.accepted >= 2, 30, "the wrong port tried again", alive=worker)
        [(state, error)] = db.execute("SELECT state, last_error FROM notifications").fetchall()
        assert state in ("pending", "sending")
        assert "not an HTTP answer" in (error or "") and "BadStatusLine" in (error or "")

        # The sender lives on: the next event is told too.
        with psycopg.connect(pg.url) as app:
            app.execute(f'SET search_path TO "{schema}"')
            cronkeeper.enqueue(app, "always_fails", {}, key="second", schema=schema,
                               max_attempts=1)
        wait_for(lambda: any(r.json()["key"] == "second" for r in good.posts("/hook")), 30,
                 "the second notification", alive=worker)
        assert [r.json()["key"] for r in good.posts("/hook")].count("first") == 1
        assert "Traceback" not in log.read_text()
    finally:
        worker.kill()
        worker.wait(10)
        wrong.close()
        good.close()
        db.close()


def test_an_email_subject_from_a_task_name_with_a_line_break_is_sent_on_one_line(
        engine, tmp_path, senders):  # noqa: F811 - the fixture
    smtp = SmtpReceiver()
    try:
        cfg = config(tmp_path, f"""{RETRY_FAST}
[sinks.mail]
kind = "email"
smtp = "{smtp.url()}"
from = "cronkeeper@example.com"
to = ["ops@example.com"]

[[rules]]
sink = "mail"
""")
        dead_letter(engine, schedule=None, task="billing.send\r\nBcc: someone@example.net")
        sender = senders(cfg)
        wait_for(lambda: note_rows(engine)[0]["state"] == "sent", 15, "the mail")
        assert sender.thread.is_alive()
        [mail] = smtp.received
        assert mail.recipients == ["ops@example.com"]
        assert mail.message["Subject"] == ("[cronkeeper] dead: task billing.send Bcc: "
                                           "someone@example.net")
        assert mail.message["Bcc"] is None
    finally:
        smtp.close()


def test_a_heartbeat_url_that_does_not_speak_http_fails_a_ping_not_the_pinger():
    wrong = NotHttp()
    pinger = Pinger(wrong.url + "/ping", 0.05, timeout=2)
    pinger.start()
    try:
        pinger.beat()
        wait_for(lambda: wrong.accepted >= 1, 10, "the first ping")
        wait_for(lambda: (pinger.beat(), wrong.accepted >= 3)[1] or not pinger.thread.is_alive(),
                 10, "more pings")
        assert pinger.thread.is_alive() and wrong.accepted >= 3
    finally:
        pinger.stop()
        wrong.close()


def test_sinks_timing_out_one_after_another_keep_the_lease_so_the_good_one_is_told_once(
        tmp_path):
    """Eight sinks that hold the request past their 2 s timeout, then a good one: a try takes
    over 16 s, longer than the lease (2 x 2 s + 5 s) and the other sender's next look. Each sink's answer renews the lease, so
    the other worker's sender never takes the notification over mid-try and sends it again."""
    pg = shared_postgres()
    schema = pg.new_schema()
    db = set_path(pg.connect(), schema)
    down = [HttpReceiver() for _ in range(8)]
    for receiver in down:
        receiver.hold.set()
    good = HttpReceiver()
    text = 'max_attempts = 10\nretry_for = "10m"\nbackoff = { base = "60s", factor = 2, max = "5m" }\n'
    for n, receiver in enumerate(down):
        text += f'[sinks.down{n}]\nkind = "webhook"\nurl = "{receiver.url}/down"\ntimeout = "2s"\n'
    text += f'[sinks.good]\nkind = "webhook"\nurl = "{good.url}/good"\ntimeout = "2s"\n'
    text += "".join(f'[[rules]]\nsink = "down{n}"\n' for n in range(8))
    text += '[[rules]]\nsink = "good"\n'
    (notify := tmp_path / "notify.toml").write_text(text)
    workers = [spawn_json_worker(pg.url, schema, "slow-sinks", f"w{n}", tmp_path / f"w{n}.log",
                                 "--notify-config", str(notify)) for n in (1, 2)]
    try:
        with psycopg.connect(pg.url) as app:
            app.execute(f'SET search_path TO "{schema}"')
            cronkeeper.enqueue(app, "permanent", {}, key="first", schema=schema)

        def told() -> list[str]:
            row = db.execute("SELECT sent_to FROM notifications").fetchone()
            return (row[0] or []) if row else []

        wait_for(lambda: "good" in told() or len(good.posts("/good")) >= 2, 60,
                 "the good sink told and recorded", alive=workers[0])
        wait_for(lambda: "good" in told() or len(good.posts("/good")) >= 2, 20,
                 "the good sink recorded")
        assert told() == ["good"]
        assert len(good.posts("/good")) == 1
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(10)
        for receiver in [*down, good]:
            receiver.close()
        db.close()


def test_a_bug_while_sending_is_said_once_and_the_sender_lives_on(
        engine, tmp_path, senders, monkeypatch, caplog):  # noqa: F811 - the fixture
    """Anything the sender's loop did not foresee (here: building the message raises, as the
    line break in a subject once did) ended the thread: nothing more was sent by that process,
    and only stderr saw a traceback. Now it is said at ERROR with its traceback once, the
    notification it was on comes back when its lease runs out, and is delivered."""
    from cronkeeper.notify.sender import Sender

    receiver = HttpReceiver()
    cfg = config(tmp_path, f"""{RETRY_FAST}
[sinks.pager]
kind = "webhook"
url = "{receiver.url}/hooks/cron"
timeout = "1s"

[[rules]]
sink = "pager"
""")
    real = Sender._message
    calls: list[int] = []

    def broken_once(self, note):  # noqa: ANN001, ANN202
        calls.append(note.id)
        if len(calls) == 1:
            raise RuntimeError("a bug while building the message")
        return real(self, note)

    monkeypatch.setattr(Sender, "_message", broken_once)
    caplog.set_level("ERROR", logger="cronkeeper.notify")
    try:
        dead_letter(engine)
        sender = senders(cfg)
        wait_for(lambda: receiver.posts("/hooks/cron"), cfg.lease + 15,
                 "the notification, once its lease ran out")
        assert sender.thread.is_alive()
        assert len(calls) == 2
        bugs = [r for r in caplog.records if getattr(r, "action", None) == "internal_error"]
        assert len(bugs) == 1 and bugs[0].exc_info is not None
        assert "a bug while building the message" in bugs[0].getMessage()
        wait_for(lambda: note_rows(engine)[0]["state"] == "sent", 10, "settled as sent")
    finally:
        receiver.close()
