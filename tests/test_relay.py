"""cronkeeper relay against the real things: PostgreSQL, RabbitMQ (a queue of each test's own).

What a wrong relay would break: routed jobs reach the broker once each with the key as task id
and are marked published; unrouted jobs stay for workers, whose claim skips routed ones; refused
publishes retry with backoff and then dead-letter; two relays never publish one job twice."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from conftest import scalar
from handlers_for_tests import wait_until
from relay_helpers import (
    AMQP_URL,
    RelayThread,
    celery_config,
    delete_amqp_queue,
    drain_amqp,
    put,
    unique,
    write_config,
)

from cronkeeper.db import outbox_claims as db


@pytest.fixture
def queue():
    name = unique("ck-relay-test")
    yield name
    delete_amqp_queue(name)


def _states(engine) -> dict[str, str]:
    import sqlalchemy as sa

    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT idempotency_key, state FROM outbox")).all())


def test_routed_jobs_are_published_once_and_unrouted_stay_for_workers(engine, schema, queue, tmp_path):
    keys = [f"billing-{i}@2026-01-01T00:00:0{i}Z" for i in range(5)]
    for key in keys:
        put(engine, schema, "billing.send_invoice", {"invoice": key}, key=key)
    put(engine, schema, "reports.build", {}, key="reports@1")
    config = write_config(tmp_path, celery_config(AMQP_URL, queue=queue))
    with RelayThread(engine, schema, config):
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'published'") == 5,
                   message="five published")
        # the worker's claim (no routes) skips routed jobs and takes the rest
        with engine.connect() as conn:
            claimed = db.outbox_claim(conn, worker_id="w", limit=100, lease_margin=5)
            conn.commit()
        assert [j.key for j in claimed] == ["reports@1"]
    messages = drain_amqp(queue, expect=5)
    assert sorted(h["id"] for h, _ in messages) == sorted(keys)  # the key is the task id, once each
    for headers, body in messages:
        assert headers["task"] == "billing.send_invoice"
        assert headers["idempotency_key"] == headers["id"]
        args, kwargs, _embed = body
        assert args == [] and kwargs == {"invoice": headers["id"]}
    rows = scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'published' AND "
                  "published_to = 'celery-main' AND target_id = idempotency_key AND "
                  "published_at IS NOT NULL AND finished_at IS NULL")
    assert rows == 5
    outcomes = scalar(engine, "SELECT string_agg(DISTINCT outcome, ',') FROM attempts a "
                      "JOIN outbox o ON o.id = a.job_id WHERE o.state = 'published'")
    assert outcomes == "published"


def test_unroutable_message_is_a_failed_publish_that_retries_then_dead_letters(engine, schema, tmp_path):
    key = "billing@2026-01-01T00:00:00Z"
    put(engine, schema, "billing.x", {}, key=key, max_attempts=2,
            backoff={"base": 0.1, "factor": 1, "max": 0.1})
    body = f"""
name = "{unique('relay')}"
lease = "5s"
poll_interval = "0.05s"

[targets.celery-main]
kind = "celery"
broker = "{AMQP_URL}"

[[routes]]
tasks = ["billing.*"]
target = "celery-main"
options = {{ exchange = "amq.direct", routing_key = "{unique('nobody')}" }}
"""
    with RelayThread(engine, schema, write_config(tmp_path, body)):
        wait_until(lambda: _states(engine)[key] == "dead", message="dead letter")
    errors = scalar(engine, "SELECT string_agg(outcome || ':' || error, ' | ' ORDER BY attempt) "
                    "FROM attempts")
    assert errors.count("NO_ROUTE") == 2, errors
    assert errors.startswith("retry:") and " | dead:" in errors
    assert scalar(engine, "SELECT attempts FROM outbox") == 2


def test_two_relays_racing_never_publish_one_job_twice(engine, schema, database_url, queue, tmp_path):
    """Two `cronkeeper relay` processes on one outbox: every job published once, one attempt
    each (no job claimed twice, none reclaimed)."""
    n = 300
    for i in range(n):
        put(engine, schema, "billing.y", {"i": i}, key=f"race-{i}")
    from relay_helpers import spawn_relay, stop

    config = write_config(tmp_path, celery_config(AMQP_URL, queue=queue))
    relays = [spawn_relay(database_url, schema, config, relay_id=f"relay-{x}") for x in "ab"]
    try:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'published'") == n,
                   timeout=90, message="all published")
    finally:
        logs = [stop(r) for r in relays]
    assert all("Traceback" not in log for log in logs), logs
    messages = drain_amqp(queue, expect=n)
    ids = [h["id"] for h, _ in messages]
    assert len(ids) == n and len(set(ids)) == n
    by = scalar(engine, "SELECT count(DISTINCT worker_id) FROM attempts")
    assert by >= 1
    assert scalar(engine, "SELECT count(*) FROM attempts") == n  # one attempt each, no re-claims


def test_broker_cut_mid_run_loses_nothing(engine, schema, queue, tmp_path):
    """RabbitMQ behind a loopback proxy the test cuts (the shared broker keeps running): while
    it is cut, jobs wait (nothing dead-lettered); restored, the relay publishes them all."""
    from relay_helpers import TcpProxy

    proxy = TcpProxy(5672)
    fast = {"backoff": {"base": 0.2, "factor": 2, "max": 1}}
    config = write_config(tmp_path, celery_config(
        f"amqp://guest:guest@127.0.0.1:{proxy.port}//", queue=queue,
        target_extra='connect_timeout = "1s"\nconfirm_timeout = "2s"'))
    first = [f"before-{i}" for i in range(10)]
    during = [f"during-{i}" for i in range(10)]
    try:
        for key in first:
            put(engine, schema, "billing.z", {}, key=key, **fast)
        with RelayThread(engine, schema, config) as relay:
            wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'published'") == 10,
                       message="published before the cut")
            proxy.cut()
            for key in during:
                put(engine, schema, "billing.z", {}, key=key, **fast)
            wait_until(lambda: relay.relay.stats["deferred"] >= 10, timeout=30,
                       message="jobs handed back while the broker is unreachable")
            states = _states(engine)
            assert {states[k] for k in during} <= {"available", "running"}
            proxy.restore()
            wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'published'") == 20,
                       timeout=60, message="caught up after the broker came back")
    finally:
        proxy.close()
    assert scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 0
    got = {h["id"] for h, _ in drain_amqp(queue, expect=20)}
    assert got == set(first + during)  # nothing lost (a duplicate would be allowed, not a gap)


def test_redis_broker_and_metrics(engine, schema, database_url, tmp_path):
    """A real `cronkeeper relay` process publishing through a Redis broker (the write is the
    acknowledgement); its metrics count what it published, with the publish lag."""
    import json
    import socket
    import subprocess
    import urllib.request

    import redis
    from handlers_for_tests import cronkeeper_exe
    from relay_helpers import REDIS_URL, stop

    queue = unique("ck-redis-test")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for i in range(3):
        put(engine, schema, "billing.r", {"i": i}, key=f"redis-{i}")
    config = write_config(tmp_path, celery_config(REDIS_URL, queue=queue))
    r = redis.Redis.from_url(REDIS_URL)
    proc = subprocess.Popen([cronkeeper_exe(), "relay", "--database-url", database_url, "--schema",
                             schema, "--config", config, "--metrics-address", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: proc.poll() is not None or scalar(
            engine, "SELECT count(*) FROM outbox WHERE state = 'published'") == 3,
            message="published through redis")
        assert proc.poll() is None, stop(proc)
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert 'cronkeeper_relay_published_total{target="celery-main"} 3.0' in body
        assert "cronkeeper_relay_publish_lag_seconds_count 3.0" in body
        assert 'cronkeeper_job_attempts_bucket{le="1.0"} 3.0' in body
        messages = [json.loads(m) for m in r.lrange(queue, 0, -1)]
        assert sorted(m["headers"]["id"] for m in messages) == ["redis-0", "redis-1", "redis-2"]
    finally:
        stop(proc)
        r.delete(queue)


def _insert_serial(engine, key: str, *, timeout: float) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, task, serial, "
            "timeout_seconds) VALUES (:k, 'serial-s', now(), 'billing.serial', true, :t)"),
            {"k": key, "t": timeout})


def _rounds_pass(relay, n: int = 5) -> None:
    """Wait until the relay went through ``n`` more rounds (claims and status polls)."""
    start = relay.stats["rounds"]
    wait_until(lambda: relay.stats["rounds"] >= start + n, message=f"{n} relay rounds")


def test_serial_jobs_wait_for_the_target_to_report_or_for_the_timeout(engine, schema, queue, tmp_path):
    """overlap = "serial" through a relay: the next job is published only after the result
    backend (a real Redis) reports the previous one finished, or, when it never does, once the
    previous job's timeout has passed since its publication."""
    from relay_helpers import REDIS_URL

    _insert_serial(engine, "serial-s@1", timeout=600)
    _insert_serial(engine, "serial-s@2", timeout=1)
    _insert_serial(engine, "serial-s@3", timeout=600)
    config = write_config(tmp_path, celery_config(AMQP_URL, queue=queue,
                                                  target_extra=f'backend = "{REDIS_URL}"'))
    with RelayThread(engine, schema, config) as thread:
        relay = thread.relay
        wait_until(lambda: _states(engine)["serial-s@1"] == "published", message="first published")
        _rounds_pass(relay)
        assert _states(engine)["serial-s@2"] == "available"  # the first still runs (PENDING)
        backend = relay.targets["celery-main"].app.backend
        try:
            backend.store_result("serial-s@1", "ok", "SUCCESS")  # what the Celery worker writes
            wait_until(lambda: _states(engine)["serial-s@2"] == "published", message="second")
            assert _states(engine)["serial-s@1"] == "succeeded"
            # the second never reports (PENDING forever): its 1 s timeout frees the schedule
            wait_until(lambda: _states(engine)["serial-s@3"] == "published", message="third")
        finally:
            for key in ("serial-s@1", "serial-s@2", "serial-s@3"):
                backend.forget(key)
    rows = dict(((k, (p, f)) for k, p, f in _rows3(engine)))
    assert rows["serial-s@1"][1] is not None and rows["serial-s@2"][0] >= rows["serial-s@1"][1]
    assert (rows["serial-s@3"][0] - rows["serial-s@2"][0]).total_seconds() >= 1.0
    assert _states(engine)["serial-s@2"] == "published"  # never reported: stays published


def _rows3(engine):
    with engine.connect() as conn:
        return conn.execute(sa.text(
            "SELECT idempotency_key, published_at, finished_at FROM outbox")).all()


def test_a_real_worker_leaves_routed_jobs_for_the_relay(engine, schema, database_url, queue, tmp_path):
    """A `cronkeeper worker` process never claims (and never dead-letters as an unknown task) a
    job a registered route matches, even with no relay running; the relay publishes it later."""
    from handlers_for_tests import spawn_worker
    from relay_helpers import stop

    config = write_config(tmp_path, celery_config(AMQP_URL, queue=queue))
    with RelayThread(engine, schema, config):
        pass  # registers the routes, then stops: no relay runs while the worker does
    put(engine, schema, "billing.charge", {}, key="routed@1")
    put(engine, schema, "noop", {}, key="plain@1")
    worker = spawn_worker(database_url, schema)
    try:
        wait_until(lambda: _states(engine)["plain@1"] == "succeeded", message="plain job run")
    finally:
        stop(worker)
    assert scalar(engine, "SELECT state || ':' || attempts FROM outbox WHERE "
                  "idempotency_key = 'routed@1'") == "available:0"
    with RelayThread(engine, schema, config):
        wait_until(lambda: _states(engine)["routed@1"] == "published", message="relayed")


def test_status_shows_relay_routes_and_published_depth(engine, schema, database_url, queue, tmp_path):
    import json
    import subprocess

    from handlers_for_tests import cronkeeper_exe

    put(engine, schema, "billing.s", {}, key="status@1")
    config = write_config(tmp_path, celery_config(AMQP_URL, queue=queue, name="main"))
    with RelayThread(engine, schema, config, relay_id="relay-status"):
        wait_until(lambda: _states(engine)["status@1"] == "published", message="published")
        base = [cronkeeper_exe(), "status", "--database-url", database_url, "--schema", schema]
        doc = json.loads(subprocess.run([*base, "--format", "json"], capture_output=True,
                                        text=True, check=True).stdout)
    assert doc["queue"]["depth"]["published"] == 1
    assert doc["relay_routes"] == [{"relay": "main", "position": 0, "target": "celery-main",
                                    "tasks": ["billing.*"], "schedules": None}]
    text = subprocess.run(base, capture_output=True, text=True).stdout
    assert "RELAY  main route 1: tasks billing.* -> celery-main" in text
    relays = [i for i in doc["instances"] if i["kind"] == "relay"]
    assert [(i["instance_id"], i["role"]) for i in relays] == [("relay-status", "relay")]
    assert len(relays[0]["schedules_digest"]) == 16  # the config file's digest


def test_confirm_timeout_is_ambiguous_and_retried_with_the_same_task_id(engine, schema, queue, tmp_path):
    """The broker takes the message but its confirm never arrives (the proxy holds the broker's
    replies): the attempt fails as ambiguous, the connection is dropped, and the retry publishes
    the same task id again. RabbitMQ then holds two copies: the at-least-once case consumers
    dedupe (docs/celery.md)."""
    from relay_helpers import TcpProxy

    proxy = TcpProxy(5672)
    fast = {"backoff": {"base": 0.2, "factor": 1, "max": 0.2}}
    config = write_config(tmp_path, celery_config(
        f"amqp://guest:guest@127.0.0.1:{proxy.port}//", queue=queue,
        target_extra='connect_timeout = "2s"\nconfirm_timeout = "1s"'))
    try:
        put(engine, schema, "billing.c", {}, key="warm", **fast)
        with RelayThread(engine, schema, config):
            wait_until(lambda: _states(engine)["warm"] == "published", message="connection warm")
            proxy.hold_replies = True
            put(engine, schema, "billing.c", {}, key="unconfirmed", **fast)
            wait_until(lambda: scalar(engine, "SELECT count(*) FROM attempts WHERE outcome = 'retry'"),
                       message="the unconfirmed attempt recorded")
            proxy.hold_replies = False
            wait_until(lambda: _states(engine)["unconfirmed"] == "published", message="retried")
    finally:
        proxy.close()
    error = scalar(engine, "SELECT error FROM attempts WHERE outcome = 'retry'")
    assert "no publisher confirm within the timeout" in error
    ids = [h["id"] for h, _ in drain_amqp(queue, expect=3)]
    assert sorted(ids) == ["unconfirmed", "unconfirmed", "warm"]
