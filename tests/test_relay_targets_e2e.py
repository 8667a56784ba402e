"""RQ, Sidekiq and BullMQ end to end: real ``cronkeeper run`` and ``cronkeeper relay``
processes, PostgreSQL, a private redis-server and each queue's real consumer (SPEC §11,
issues 8 and 13).

- every period of a 1-second schedule reaches the consumer exactly once, and the relay learns
  that each finished (the outbox row becomes ``succeeded``);
- a relay SIGKILLed between publish and mark republishes with the same id, and the target
  absorbs it (RQ: ``unique``; BullMQ: the job id; Sidekiq: the middleware in contrib/sidekiq);
- overlap = "skip" holds while a BullMQ job is still active.
"""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from conftest import libpq_url, scalar
from daemon_harness import Daemon, assert_audit_clean, set_path, write_schedules
from relay_helpers import (  # noqa: F401 - private_redis is a fixture
    NodeWorker,
    SidekiqServer,
    effects,
    private_redis,
    put,
    rq_worker,
    spawn_relay,
    stop,
    stop_process,
    unique,
    wait_for,
    write_config,
)

from cronkeeper.relay.targets.base import sidekiq_jid, unsafe_id

TASKS = {"rq": "relay_consumers.record", "sidekiq": "RecordJob", "bullmq": "record"}


class Consumer:
    """One kind's real consumer on ``queue``, and the keys of the runs it recorded."""

    def __init__(self, kind: str, url: str, queue: str, out: Path) -> None:
        self.kind, self.queue, self.out = kind, queue, out
        if kind == "rq":
            self.proc = rq_worker(url, queue, out, burst=False)
        elif kind == "sidekiq":
            import redis

            self.server = SidekiqServer(url, queue, out, middleware=True)
            self.proc = self.server.proc
            client = redis.Redis.from_url(url)
            wait_for(lambda: client.scard("processes") >= 1, 120, "sidekiq", alive=self.proc)
        else:
            self.worker = NodeWorker(url, queue, "bull", out)
            self.proc = self.worker.proc

    def keys(self, candidates: set[str] = frozenset()) -> list[str]:
        """The idempotency key of every run, in order."""
        jids = {sidekiq_jid(k): k for k in candidates}
        out = []
        for line in effects(self.out):
            first = line.split(" ", 1)[0]
            if self.kind == "rq":
                out.append(first)
            elif self.kind == "sidekiq":
                out.append(jids.get(first, first))
            else:
                out.append(unsafe_id(first.removeprefix("ck-")))
        return out

    def drained(self, client) -> bool:
        key = {"rq": f"rq:queue:{self.queue}", "sidekiq": f"queue:{self.queue}",
               "bullmq": f"bull:{self.queue}:wait"}[self.kind]
        return client.llen(key) == 0

    def stop(self) -> None:
        stop_process(self.proc)  # graceful: a job in hand finishes first


def relay_config(kind: str, url: str, queue: str, *, lease: str = "2s") -> str:
    return f"""
name = "{unique('relay')}"
lease = "{lease}"
poll_interval = "0.05s"
status_interval = "0.2s"

[targets.t]
kind = "{kind}"
redis = "{url}"
queue = "{queue}"

[[routes]]
tasks = ["{TASKS[kind]}"]
target = "t"
"""


def schedule(name: str, task: str, *, overlap: str, payload: str = "{}") -> str:
    return f"""[{name}]
every = "1s"
timezone = "UTC"
misfire = "catch_up"
catch_up_limit = "1h"
overlap = "{overlap}"
timeout = "60s"
task = "{task}"
payload = {payload}
owner = "tests"
"""


def rows(engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql)).all()]


@pytest.mark.parametrize("kind", ["rq", "sidekiq", "bullmq"])
def test_every_period_reaches_the_consumer_once_and_its_completion_comes_back(
        kind, engine, schema, database_url, cluster, private_redis, tmp_path):  # noqa: F811
    queue = unique(kind)
    write_schedules(tmp_path / "schedules", {"tick.toml": schedule("tick", TASKS[kind],
                                                                   overlap="allow")})
    config = write_config(tmp_path, relay_config(kind, private_redis.url, queue))
    consumer = Consumer(kind, private_redis.url, queue, tmp_path / "effects")
    relay = spawn_relay(database_url, schema, config)
    daemon = Daemon(url=database_url, schema=schema, cluster=cluster,
                    schedules=tmp_path / "schedules", instance_id="vm1", log_dir=tmp_path).start()
    try:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM outbox") >= 5, 90,
                 "five periods emitted")
        with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
            assert_audit_clean(set_path(conn, schema), context=f"{kind}, while running")
        daemon.stop()
        emitted = {r[0] for r in rows(engine, "SELECT idempotency_key FROM outbox")}
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state IN "
                                "('published', 'succeeded')") == len(emitted), 60, "all published")
        wait_for(lambda: len(consumer.keys(emitted)) >= len(emitted), 90, "all consumed")
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'succeeded'")
                 == len(emitted), 60, "the relay to learn every completion from the target")
        client = private_redis.client()
        wait_for(lambda: consumer.drained(client), 30, "the queue to drain")
    finally:
        daemon.kill()
        relay_log = stop(relay)
        consumer.stop()
    assert sorted(consumer.keys(emitted)) == sorted(emitted), relay_log  # each exactly once
    assert {r[0] for r in rows(engine, "SELECT published_to FROM outbox")} == {"t"}


@pytest.mark.parametrize("kind", ["rq", "sidekiq", "bullmq"])
def test_relay_killed_between_publish_and_mark_republishes_the_same_id_and_it_is_absorbed(
        kind, engine, schema, database_url, private_redis, tmp_path):  # noqa: F811
    queue = unique(kind)
    key = "invoices@2026-03-08T07:00:00Z"
    put(engine, schema, TASKS[kind], {"invoice": 7}, key=key)
    config = write_config(tmp_path, relay_config(kind, private_redis.url, queue))
    consumer = Consumer(kind, private_redis.url, queue, tmp_path / "effects")
    try:
        doomed = spawn_relay(database_url, schema, config, relay_id="relay-doomed",
                             kill_after_publish=1)
        assert doomed.wait(60) == -signal.SIGKILL, stop(doomed)
        assert scalar(engine, "SELECT state || ':' || leased_by FROM outbox") == \
            "running:relay-doomed"
        wait_for(lambda: consumer.keys({key}) == [key], 60, "the first copy to run")
        survivor = spawn_relay(database_url, schema, config, relay_id="relay-survivor")
        try:
            wait_for(lambda: scalar(engine, "SELECT state FROM outbox") in ("published",
                     "succeeded"), 60, "the republish after the lease expired")
            client = private_redis.client()
            wait_for(lambda: consumer.drained(client), 30, "the queue to drain")
            if kind == "sidekiq":  # the copy was queued: wait until the server took it
                wait_for(lambda: int(client.get("stat:processed") or 0) >= 2, 60,
                         "the second copy to be processed (skipped)")
            wait_for(lambda: scalar(engine, "SELECT state FROM outbox") == "succeeded", 60,
                     "the completion")
        finally:
            survivor_log = stop(survivor)
    finally:
        consumer.stop()
    assert consumer.keys({key}) == [key], survivor_log  # the effect once
    assert rows(engine, "SELECT attempt, worker_id, outcome FROM attempts ORDER BY attempt") == [
        (1, "relay-doomed", "lease_expired"), (2, "relay-survivor", "published")]
    expected_id = {"rq": "invoices_402026-03-08T07_3a00_3a00Z", "sidekiq": sidekiq_jid(key),
                   "bullmq": "ck-invoices_402026-03-08T07_3a00_3a00Z"}[kind]
    assert scalar(engine, "SELECT target_id FROM outbox") == expected_id


def test_overlap_skip_holds_while_a_bullmq_job_is_still_active(
        engine, schema, database_url, cluster, private_redis, tmp_path):  # noqa: F811
    """A 1-second schedule whose jobs take 3 s on the Node worker: while one is active in
    BullMQ, the next periods are skipped (overlap); once BullMQ reports it completed, the next
    period is emitted. The worker never runs two at once."""
    queue = unique("bullmq")
    write_schedules(tmp_path / "schedules", {"slow.toml": schedule(
        "slow", "record", overlap="skip", payload="{ sleep = 3 }")})
    config = write_config(tmp_path, relay_config("bullmq", private_redis.url, queue))
    starts = tmp_path / "starts"
    worker = NodeWorker(private_redis.url, queue, "bull", tmp_path / "effects", starts)
    relay = spawn_relay(database_url, schema, config)
    daemon = Daemon(url=database_url, schema=schema, cluster=cluster,
                    schedules=tmp_path / "schedules", instance_id="vm1", log_dir=tmp_path).start()
    try:
        wait_for(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'succeeded'")
                 >= 2, 120, "two jobs to complete on the worker")
        with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
            assert_audit_clean(set_path(conn, schema), context="overlap, while running")
        daemon.stop()
    finally:
        daemon.kill()
        relay_log = stop(relay)
        worker.stop()
    skipped = scalar(engine, "SELECT count(*) FROM periods WHERE outcome = 'skipped' "
                     "AND reason = 'overlap'")
    assert skipped >= 2, relay_log  # a 3 s job on a 1 s schedule skips periods
    lines = starts.read_text().splitlines()
    assert lines, relay_log
    # start a, end a, start b, end b, ...: never two jobs active at once
    assert [line.split()[0] for line in lines[: len(lines) // 2 * 2]] == \
        ["start", "end"] * (len(lines) // 2)
    assert all(lines[i].split()[1] == lines[i + 1].split()[1] for i in range(0, len(lines) - 1, 2))
