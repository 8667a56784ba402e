"""The Sidekiq target against a real Redis and a real Sidekiq server (Debian's ruby-sidekiq,
6.4.1), with and without the optional middleware in contrib/sidekiq (SPEC §11, issue 13).

Sidekiq 8 needs a newer Ruby than Debian 12 has, so its format (integer milliseconds) is
checked by golden JSON against its documented job format instead (test_sidekiq_format.py)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from relay_helpers import (  # noqa: F401 - private_redis is a fixture
    SidekiqServer,
    effects,
    private_redis,
    relay_job,
    unique,
    wait_for,
)

from cronkeeper.relay.targets import sidekiq as sidekiq_target
from cronkeeper.relay.targets.base import (
    Completion,
    Delivery,
    PermanentPublishError,
    PublishError,
    sidekiq_jid,
)


@pytest.fixture
def start_sidekiq(private_redis, tmp_path) -> Iterator:  # noqa: F811
    servers: list[SidekiqServer] = []

    def start(queue: str, *, middleware: bool = True) -> SidekiqServer:
        server = SidekiqServer(private_redis.url, queue, tmp_path / "effects", middleware)
        servers.append(server)
        client = private_redis.client()
        wait_for(lambda: client.scard("processes") >= 1, 120, "sidekiq to register",
                 alive=server.proc)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def target(private_redis) -> Iterator[sidekiq_target.SidekiqTarget]:  # noqa: F811
    t = sidekiq_target.build("sk-test", {"kind": "sidekiq", "redis": private_redis.url})
    yield t
    t.close()


def ran(tmp_path) -> list[tuple[str, list]]:
    """(jid, args) of every run the Sidekiq server recorded."""
    out = []
    for line in effects(tmp_path / "effects"):
        jid, args = line.split(" ", 1)
        out.append((jid, json.loads(args)))
    return out


def test_every_published_job_runs_on_a_real_sidekiq_server(target, start_sidekiq, tmp_path):
    queue = unique("sk")
    start_sidekiq(queue)
    jobs = [relay_job("every-second", n, task="RecordJob", payload={"n": n, "region": "eu"})
            for n in range(6)]
    jids = [target.publish(job, Delivery(queue=queue)) for job in jobs]
    assert jids == [sidekiq_jid(job.key) for job in jobs]
    wait_for(lambda: len(ran(tmp_path)) >= 6, 60, "six runs")
    assert sorted(ran(tmp_path)) == sorted(
        (sidekiq_jid(job.key), [{"n": job.id, "region": "eu"}]) for job in jobs)
    wait_for(lambda: all(target.status(j) == Completion.SUCCEEDED for j in jids), 30,
             "the middleware to record every completion")


def test_republished_jid_is_skipped_by_the_middleware(target, start_sidekiq, tmp_path):
    """The relay's crash window, twice: a copy published while the first one runs, and one after
    it finished. The middleware's dedupe recipe runs the jid once."""
    queue = unique("sk")
    start_sidekiq(queue)
    job = relay_job("crashy", 1, task="RecordJob", payload={"sleep": 1.5})
    jid = target.publish(job, Delivery(queue=queue))
    wait_for(lambda: target.status(jid) == Completion.PENDING, 60, "the first copy to start")
    again = dataclasses.replace(job, attempt=2)  # the relay's second claim of the job
    target.publish(again, Delivery(queue=queue))  # while the first copy runs
    wait_for(lambda: target.status(jid) == Completion.SUCCEEDED, 60, "the first copy to finish")
    target.publish(again, Delivery(queue=queue))  # after it finished
    marker = relay_job("marker", 2, task="RecordJob")  # FIFO queue: runs after the copies
    target.publish(marker, Delivery(queue=queue))
    wait_for(lambda: any(j == sidekiq_jid(marker.key) for j, _ in ran(tmp_path)), 60, "the marker")
    wait_for(lambda: target._redis.llen(f"queue:{queue}") == 0, 30, "the queue to drain")
    assert [j for j, _ in ran(tmp_path)].count(jid) == 1


def test_without_the_middleware_sidekiq_runs_every_copy_and_status_is_unknown(
    target, start_sidekiq, tmp_path
):
    """What the docs warn about: Sidekiq itself does not dedupe by jid."""
    queue = unique("sk")
    start_sidekiq(queue, middleware=False)
    job = relay_job("no-middleware", 1, task="RecordJob")
    jid = target.publish(job, Delivery(queue=queue))
    target.publish(job, Delivery(queue=queue))
    wait_for(lambda: len(ran(tmp_path)) >= 2, 60, "both copies to run")
    assert [j for j, _ in ran(tmp_path)] == [jid, jid]
    assert target.status(jid) == Completion.UNKNOWN


def test_a_job_sidekiq_gives_up_on_is_reported_failed(target, start_sidekiq):
    queue = unique("sk")
    start_sidekiq(queue)
    jid = target.publish(relay_job("doomed", 1, task="FailJob"),
                         Delivery(queue=queue, options=(("retry", False),)))
    wait_for(lambda: target.status(jid) == Completion.FAILED, 60, "the death handler")


def test_a_future_run_after_goes_through_the_schedule_set(target, start_sidekiq, tmp_path,
                                                          private_redis):  # noqa: F811
    queue = unique("sk")
    job = relay_job("later", 1, task="RecordJob",
                    run_after=datetime.now(UTC) + timedelta(seconds=2))
    jid = target.publish(job, Delivery(queue=queue))
    client = private_redis.client()
    [(body, score)] = client.zrange("schedule", 0, -1, withscores=True)
    assert score == pytest.approx(job.run_after.timestamp(), abs=0.001)
    assert "enqueued_at" not in json.loads(body) and client.llen(f"queue:{queue}") == 0
    start_sidekiq(queue)
    wait_for(lambda: ran(tmp_path), 90, "the scheduled job to run")
    assert ran(tmp_path) == [(jid, [{"n": 1}])]


def test_route_args_spread_payload_values_as_positional_arguments(target, start_sidekiq, tmp_path):
    queue = unique("sk")
    start_sidekiq(queue)
    job = relay_job("spread", 1, task="RecordJob", payload={"user": 7, "kind": "digest"})
    target.publish(job, Delivery(queue=queue, options=(("args", ["kind", "user"]),)))
    wait_for(lambda: ran(tmp_path), 60, "the job")
    assert ran(tmp_path) == [(sidekiq_jid(job.key), ["digest", 7])]
    with pytest.raises(PermanentPublishError, match="'missing'"):
        target.publish(job, Delivery(queue=queue, options=(("args", ["missing"]),)))


def test_redis_restarted_mid_run_loses_nothing(target, start_sidekiq, private_redis, tmp_path):  # noqa: F811
    """Redis dies between two publishes (and takes its unpersisted data with it): the publish
    fails retryably, the relay's retry after the restart lands, and Sidekiq, which reconnects on
    its own, runs it."""
    queue = unique("sk")
    start_sidekiq(queue)
    first = relay_job("outage", 1, task="RecordJob")
    target.publish(first, Delivery(queue=queue))
    wait_for(lambda: len(ran(tmp_path)) == 1, 60, "the first job")
    private_redis.stop()
    second = relay_job("outage", 2, task="RecordJob")
    with pytest.raises(PublishError) as failure:
        target.publish(second, Delivery(queue=queue))
    assert not isinstance(failure.value, PermanentPublishError)
    private_redis.start()
    target.publish(second, Delivery(queue=queue))
    wait_for(lambda: len(ran(tmp_path)) == 2, 120, "the second job after the restart")
    assert [j for j, _ in ran(tmp_path)] == [sidekiq_jid(first.key), sidekiq_jid(second.key)]


def test_a_replayed_dead_letter_runs_again_and_reports_afresh(target, start_sidekiq, tmp_path):
    """dlq replay publishes the job again as a first attempt: the middleware's old "failed"
    record must not skip it, nor be read as its new outcome."""
    queue = unique("sk")
    start_sidekiq(queue)
    job = relay_job("replayed", 1, task="RecordJob")
    jid = sidekiq_jid(job.key)
    target._redis.set(target.status_prefix + jid, "failed")  # what its first life left behind
    retried = dataclasses.replace(job, attempt=2)  # a crash-window copy is still skipped...
    target.publish(retried, Delivery(queue=queue))
    wait_for(lambda: target._redis.llen(f"queue:{queue}") == 0, 60, "the copy to be taken")
    wait_for(lambda: int(target._redis.get("stat:processed") or 0) >= 1, 60, "the skip")
    assert ran(tmp_path) == [] and target.status(jid) == Completion.FAILED
    target.publish(job, Delivery(queue=queue))  # ...the replay (attempt 1) runs
    wait_for(lambda: target.status(jid) == Completion.SUCCEEDED, 60, "the replayed run")
    assert [j for j, _ in ran(tmp_path)] == [jid]


def test_publish_many_lands_the_good_jobs_in_one_transaction_and_reports_the_bad_one(target):
    queue = unique("sk")
    good = [relay_job("batch", n, task="RecordJob", payload={"n": n}) for n in (1, 3)]
    bad = relay_job("batch", 2, task="RecordJob", payload={"n": 2})
    spread = Delivery(queue=queue, options=(("args", ["missing"]),))
    results = target.publish_many([(good[0], Delivery(queue=queue)), (bad, spread),
                                   (good[1], Delivery(queue=queue))])
    assert results[0] == sidekiq_jid(good[0].key) and results[2] == sidekiq_jid(good[1].key)
    assert isinstance(results[1], PermanentPublishError)
    bodies = [json.loads(b) for b in target._redis.lrange(f"queue:{queue}", 0, -1)]
    assert sorted(b["jid"] for b in bodies) == sorted([results[0], results[2]])
