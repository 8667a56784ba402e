"""The relay against brokers that accept the connection and then stall: real PostgreSQL and a
private redis-server behind a loopback proxy the test makes mute (the broker itself keeps
running).

What a wrong relay would break: a Redis that stops answering (hung, partitioned) is the
target's failure, so its jobs wait and none is dead-lettered."""

from __future__ import annotations

import time

from conftest import scalar
from handlers_for_tests import wait_until
from relay_helpers import (  # noqa: F401 - private_redis is a fixture
    RelayThread,
    TcpProxy,
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

