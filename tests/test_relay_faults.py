"""The relay against brokers that accept the connection and then stall: real PostgreSQL, a real
RabbitMQ and a private redis-server, each behind a loopback proxy the test makes slow or mute
(the shared brokers themselves keep running).

What a wrong relay would break: a Redis that stops answering (hung, partitioned) is the
target's failure, so its jobs wait and none is dead-lettered; a broker that answers a byte at a
time holds no publish past half the lease, so the relay's other targets keep going, no lease
runs out under a publish in flight, and nothing is lost once it answers again."""

from __future__ import annotations

import time

import pytest
from conftest import scalar
from handlers_for_tests import wait_until
from relay_helpers import (  # noqa: F401 - private_redis is a fixture
    AMQP_URL,
    RelayThread,
    TcpProxy,
    delete_amqp_queue,
    drain_amqp,
    private_redis,
    put,
    unique,
    write_config,
)

FAST = {"backoff": {"base": 0.2, "factor": 1, "max": 0.2}}


def _states(engine) -> dict[str, str]:
    import sqlalchemy as sa

    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT idempotency_key, state FROM outbox")).all())


@pytest.fixture
def queue():
    name = unique("ck-relay-faults")
    yield name
    delete_amqp_queue(name)


def test_a_redis_that_stops_answering_dead_letters_nothing(engine, schema, private_redis, tmp_path):  # noqa: F811
    """Redis behind a proxy that holds its replies (a hung or partitioned Redis: the connection
    is accepted, nothing comes back). Jobs of one attempt each wait for it instead of becoming
    dead letters; answering again, it gets every one of them, once."""
    proxy = TcpProxy(private_redis.port)
    config = write_config(tmp_path, f"""
name = "{unique('relay')}"
lease = "15s"
poll_interval = "0.05s"
[targets.rq-main]
kind = "rq"
redis = "redis://127.0.0.1:{proxy.port}/0"
socket_timeout = 1
[[routes]]
tasks = ["relay_consumers.*"]
target = "rq-main"
""")
    keys = [f"mute-{i}" for i in range(3)]
    try:
        put(engine, schema, "relay_consumers.record", {}, key="warm", max_attempts=1)
        with RelayThread(engine, schema, config):
            wait_until(lambda: _states(engine)["warm"] == "published", message="warm publish")
            proxy.hold_replies = True
            for key in keys:
                put(engine, schema, "relay_consumers.record", {"k": key}, key=key,
                    max_attempts=1, **FAST)
            wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE idempotency_key "
                                              "LIKE 'mute-%' AND last_error IS NOT NULL") == 3,
                       timeout=60, message="each job tried while Redis is mute")
            time.sleep(3)  # several more timeouts
            states = _states(engine)
            assert {states[k] for k in keys} <= {"available", "running"}, states
            proxy.hold_replies = False
            wait_until(lambda: {_states(engine)[k] for k in keys} == {"published"}, timeout=60,
                       message="all published once Redis answers")
    finally:
        proxy.close()
    assert scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 0
    queued = private_redis.client().lrange("rq:queue:default", 0, -1)
    assert sorted(q.decode() for q in queued) == sorted(["warm", *keys])  # RQ ids = the keys


def test_a_dripping_broker_holds_no_publish_past_half_the_lease(engine, schema, private_redis,  # noqa: F811
                                                                queue, tmp_path):
    """RabbitMQ behind a proxy that hands its answers over one byte every 0.3 s: the AMQP
    handshake alone would take minutes, each read inside the socket timeouts. The relay waits for
    it half its lease, no more: the jobs another target (RQ, healthy) took in the same round are
    marked published meanwhile, the Celery job goes back uncounted (not a dead letter, no lease
    overrun), and once the broker answers normally it is published, once."""
    proxy = TcpProxy(5672)
    config = write_config(tmp_path, f"""
name = "{unique('relay')}"
lease = "8s"
poll_interval = "0.05s"
[targets.celery-main]
kind = "celery"
broker = "amqp://guest:guest@127.0.0.1:{proxy.port}//"
[targets.rq-main]
kind = "rq"
redis = "{private_redis.url}"
[[routes]]
tasks = ["billing.*"]
target = "celery-main"
queue = "{queue}"
[[routes]]
tasks = ["relay_consumers.*"]
target = "rq-main"
""")
    fast = [f"fast-{i}" for i in range(3)]
    try:
        proxy.drip = 0.3
        put(engine, schema, "billing.slow", {}, key="slow", max_attempts=1, **FAST)
        for key in fast:
            put(engine, schema, "relay_consumers.record", {}, key=key, max_attempts=1)
        with RelayThread(engine, schema, config) as relay:
            wait_until(lambda: {_states(engine)[k] for k in fast} == {"published"}, timeout=40,
                       message="the healthy target's jobs marked while the other drips")
            assert _states(engine)["slow"] in ("available", "running")
            wait_until(lambda: relay.relay.stats["deferred"] >= 1, timeout=40,
                       message="the dripping target's job handed back")
            more = [f"fast-more-{i}" for i in range(3)]
            for key in more:
                put(engine, schema, "relay_consumers.record", {}, key=key, max_attempts=1)
            wait_until(lambda: {_states(engine)[k] for k in more} == {"published"}, timeout=40,
                       message="the healthy target keeps going")
            proxy.drip = 0.0
            wait_until(lambda: _states(engine)["slow"] == "published", timeout=120,
                       message="published once the broker answers")
        assert not relay.thread.is_alive(), "the relay did not stop"
    finally:
        proxy.close()
    assert scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 0
    assert scalar(engine, "SELECT count(*) FROM attempts WHERE outcome = 'retry'") == 0
    assert [h["id"] for h, _ in drain_amqp(queue, expect=1)] == ["slow"]


def test_a_dripping_status_answer_holds_no_publish_of_another_target(
        engine, schema, private_redis, tmp_path):  # noqa: F811
    """The relay asks RQ about the jobs it published (the completions poll) on the loop that
    also claims and publishes. With one target's Redis answering a byte every 3 s (each read
    inside its socket timeout), one status question took over half a minute, and the loop
    published nothing for any target meanwhile. Asked on the target's own lane and waited for a
    quarter of the lease, it holds back only that target; the healthy one keeps publishing."""
    proxy = TcpProxy(private_redis.port)
    config = write_config(tmp_path, f"""
name = "{unique('relay')}"
lease = "8s"
poll_interval = "0.05s"
status_interval = "0.2s"
[targets.rq-slow]
kind = "rq"
redis = "redis://127.0.0.1:{proxy.port}/0"
socket_timeout = 10
[targets.rq-main]
kind = "rq"
redis = "{private_redis.url}"
[[routes]]
tasks = ["slow.*"]
target = "rq-slow"
[[routes]]
tasks = ["relay_consumers.*"]
target = "rq-main"
""")
    fresh = [f"fresh-{i}" for i in range(3)]
    try:
        put(engine, schema, "slow.report", {}, key="asked-about", max_attempts=1)
        with RelayThread(engine, schema, config):
            wait_until(lambda: _states(engine)["asked-about"] == "published",
                       message="a job published to the target before it drips")
            proxy.drip = 3.0  # its status is asked every round, and now answered slowly
            time.sleep(1)  # a status round is under way
            for key in fresh:
                put(engine, schema, "relay_consumers.record", {}, key=key, max_attempts=1)
            wait_until(lambda: {_states(engine)[k] for k in fresh} == {"published"}, timeout=20,
                       message="the healthy target's jobs published while the other drips")
            proxy.drip = 0.0
    finally:
        proxy.close()
    assert scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'dead'") == 0
