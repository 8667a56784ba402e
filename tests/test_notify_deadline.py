"""A sink's ``timeout`` bounds its whole request (docs/notifications.md, "Sending"): a webhook,
a heartbeat URL or an SMTP server that answers a byte at a time, each byte well within the
timeout ("slow drip"), kept the request alive for as long as it dripped: past the sender's
lease, so a second sender took the notification over and sent it again while the first was
still stuck, and the sinks after the dripping one were told by nobody. Now the request ends at
its timeout, a failure of that sink, retried, naming the sink. Real drip servers on loopback,
real workers, a real PostgreSQL. The bounds are generous (the machine is shared): "ended within
timeout + 5 s while the drip would last 60 s"."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from itertools import pairwise

import psycopg
import pytest
from daemon_harness import set_path, shared_postgres, spawn_json_worker, wait_for
from notify_receivers import Drip, HttpReceiver

import cronkeeper
from cronkeeper.notify.heartbeat import Pinger
from cronkeeper.notify.messages import Message
from cronkeeper.notify.model import Sink, SinkKind
from cronkeeper.notify.sinks import SendError, send

DRIP = 60.0  # how long each drip would last, were it not cut
MESSAGE = Message(id=7, event="dead", schedule="nightly-invoices", task="billing.send",
                  owner=None, key="k", attempts=1, error="exit code 1", output_tail="", count=1,
                  window_from=None, window_until=None, at=datetime.now(UTC))


def timed_send(sink: Sink) -> tuple[float, SendError]:
    began = time.monotonic()
    with pytest.raises(SendError) as raised:
        send(sink, MESSAGE, {})
    return time.monotonic() - began, raised.value


@pytest.mark.parametrize("kind", ["webhook", "email"])
def test_a_sink_that_drips_its_answer_fails_at_its_timeout_and_is_retried(kind):
    drip = Drip("http" if kind == "webhook" else "smtp", lasting=DRIP)
    settings = ((("url", drip.url + "/hook"),) if kind == "webhook" else
                (("smtp", drip.url), ("from", "cronkeeper@example.com"),
                 ("to", ["ops@example.com"])))
    try:
        took, error = timed_send(Sink("slow", SinkKind(kind), settings, 1.0))
        assert took < 1.0 + 5, f"the request lasted {took:.1f}s, its timeout is 1s"
        assert not error.permanent
        assert "sink 'slow'" in str(error)
        assert "the whole request passed its timeout of 1s" in str(error)
        # and the connection was let go of, not left dripping
        wait_for(lambda: all(end for _, end in drip.spans), 10, "the drip let go of")
    finally:
        drip.close()


def test_a_heartbeat_url_that_drips_fails_a_ping_at_its_timeout_and_the_next_ping_goes():
    drip = Drip(lasting=DRIP)
    pinger = Pinger(drip.url + "/ping", 0.05, timeout=1)
    pinger.start()
    stop = threading.Event()

    def lead() -> None:  # a leader's ticks, each asking for a ping when one is due
        while not stop.wait(0.05):
            pinger.beat()

    threading.Thread(target=lead, daemon=True).start()
    try:
        wait_for(lambda: len(drip.spans) >= 3, 1.0 + 5 + 10, "three pings, each cut at 1s")
        assert pinger.thread.is_alive()
    finally:
        stop.set()
        pinger.stop()
        drip.close()


def test_a_dripping_sink_never_outlives_the_lease_so_no_sender_sends_twice(tmp_path):
    """Two workers; a dripping webhook (timeout 2 s, lease 2 x 2 + 5 = 9 s) before a good one.
    Before: the first sender stayed on the drip for the whole 60 s, its lease ran out after 9 s,
    the other sender took the notification and dripped too, and so on: the good sink was told
    by no one, the drip sink once per sender. Now the drip fails at 2 s, the good sink is told
    at once and once, and the drip is tried again after the backoff, by one sender at a time."""
    pg = shared_postgres()
    schema = pg.new_schema()
    db = set_path(pg.connect(), schema)
    drip, good = Drip(lasting=DRIP), HttpReceiver()
    (notify := tmp_path / "notify.toml").write_text(f"""max_attempts = 10
retry_for = "10m"
backoff = {{ base = "60s", factor = 2, max = "5m" }}

[sinks.drip]
kind = "webhook"
url = "{drip.url}/hook"
timeout = "2s"

[sinks.good]
kind = "webhook"
url = "{good.url}/good"
timeout = "2s"

[[rules]]
sink = "drip"

[[rules]]
sink = "good"
""")
    workers = [spawn_json_worker(pg.url, schema, "drip-sink", f"w{n}", tmp_path / f"w{n}.log",
                                 "--notify-config", str(notify)) for n in (1, 2)]
    try:
        with psycopg.connect(pg.url) as app:
            app.execute(f'SET search_path TO "{schema}"')
            cronkeeper.enqueue(app, "permanent", {}, key="first", schema=schema)
        wait_for(lambda: good.posts("/good"), 2 + 30, "the good sink told", alive=workers[0])
        first = wait_for(lambda: drip.spans, 5, "the drip tried")[0][0]
        # Watch past the lease (9 s): before, the other sender took over the notification then.
        time.sleep(max(0.0, first + 9 + 5 - time.monotonic()))
        spans = [(began - first, (end or time.monotonic()) - first) for began, end in drip.spans]
        assert all(end - began < 2 + 5 for began, end in spans), spans
        assert all(b[0] >= a[1] for a, b in pairwise(spans)), f"overlapping: {spans}"
        assert len(good.posts("/good")) == 1
        state, sent_to, error = db.execute(
            "SELECT state, sent_to, last_error FROM notifications").fetchone()
        assert sent_to == ["good"] and state in ("pending", "sending")
        assert "the whole request passed its timeout of 2s" in error
    finally:
        for worker in workers:
            worker.kill()
            worker.wait(10)
        drip.close()
        good.close()
        db.close()
