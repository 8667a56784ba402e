"""The BullMQ target (the official Python client) against a real Redis and a real Node BullMQ
worker (tests/node, installed by scripts/test-deps.sh with npm ci) (SPEC §11, issue 13)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from relay_helpers import (  # noqa: F401 - private_redis is a fixture
    NodeWorker,
    effects,
    private_redis,
    relay_job,
    unique,
    wait_for,
)

from cronkeeper.relay.targets import bullmq as bullmq_target
from cronkeeper.relay.targets._redis import TargetConfigError
from cronkeeper.relay.targets.base import (
    Completion,
    Delivery,
    PermanentPublishError,
    PublishError,
    bullmq_job_id,
    unsafe_id,
)


@pytest.fixture
def start_worker(private_redis, tmp_path) -> Iterator:  # noqa: F811
    workers: list[NodeWorker] = []

    def start(queue: str, prefix: str = "bull") -> NodeWorker:
        worker = NodeWorker(private_redis.url, queue, prefix, tmp_path / "effects")
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.stop()


@pytest.fixture
def make_target(private_redis) -> Iterator:  # noqa: F811
    targets = []

    def make(**settings):
        t = bullmq_target.build("bull-test", {"kind": "bullmq", "redis": private_redis.url,
                                              **settings})
        targets.append(t)
        return t

    yield make
    for t in targets:
        t.close()


def ran(tmp_path) -> list[tuple[str, dict]]:
    out = []
    for line in effects(tmp_path / "effects"):
        job_id, data = line.split(" ", 1)
        out.append((job_id, json.loads(data)))
    return out


def test_every_published_job_runs_once_on_a_real_node_worker(make_target, start_worker, tmp_path):
    queue = unique("bq")
    target = make_target(queue=queue)
    start_worker(queue)
    jobs = [relay_job("every-second", n, task="record", payload={"n": n}) for n in range(6)]
    ids = [target.publish(job, Delivery()) for job in jobs]
    assert ids == [bullmq_job_id(job.key) for job in jobs]
    assert [unsafe_id(i.removeprefix("ck-")) for i in ids] == [job.key for job in jobs]
    wait_for(lambda: len(ran(tmp_path)) >= 6, 60, "six runs")
    assert sorted(ran(tmp_path)) == sorted((bullmq_job_id(j.key), {"n": j.id}) for j in jobs)
    wait_for(lambda: all(target.status(i) == Completion.SUCCEEDED for i in ids), 30, "completed")
    assert target.duplicates == 0


def test_a_duplicate_job_id_is_detected_and_absorbed(make_target, start_worker, tmp_path,
                                                     private_redis):  # noqa: F811
    """The relay's crash window: the same job published again (its second claim), before it ran
    and after it completed. BullMQ keeps the one job; the target counts the duplicates."""
    queue = unique("bq")
    target = make_target(queue=queue)
    job = relay_job("crashy", 1, task="record")
    again = dataclasses.replace(job, attempt=2)
    first = target.publish(job, Delivery())
    assert target.duplicates == 0
    assert target.publish(again, Delivery()) == first
    assert target.duplicates == 1
    assert private_redis.client().llen(f"bull:{queue}:wait") == 1
    start_worker(queue)
    wait_for(lambda: target.status(first) == Completion.SUCCEEDED, 60, "the job to complete")
    assert target.publish(again, Delivery()) == first  # kept after completion: absorbed again
    assert target.duplicates == 2
    assert target.publish(job, Delivery()) == first  # a first attempt is not asked about, and
    assert target.duplicates == 2  # BullMQ absorbs it all the same
    marker = relay_job("marker", 2, task="record")
    target.publish(marker, Delivery())
    wait_for(lambda: target.status(bullmq_job_id(marker.key)) == Completion.SUCCEEDED, 60, "marker")
    assert [i for i, _ in ran(tmp_path)].count(first) == 1
    stored = json.loads(private_redis.client().hget(f"bull:{queue}:{first}", "opts"))
    assert stored["removeOnComplete"] == {"age": bullmq_target.DEFAULT_KEEP_COMPLETED}


def test_status_follows_the_job_through_active_failed_and_unknown(make_target, start_worker):
    queue = unique("bq")
    target = make_target(queue=queue)
    start_worker(queue)
    slow = target.publish(relay_job("slow", 1, task="record", payload={"sleep": 2}), Delivery())
    doomed = target.publish(relay_job("doomed", 2, task="fail"), Delivery())
    wait_for(lambda: target.status(doomed) == Completion.FAILED, 60, "the failure")
    assert target.status(slow) in (Completion.PENDING, Completion.SUCCEEDED)
    wait_for(lambda: target.status(slow) == Completion.SUCCEEDED, 60, "the slow job")
    assert target.status(bullmq_job_id("never@2026-01-01T00:00:00Z")) == Completion.UNKNOWN


def test_future_run_after_is_a_delay_and_another_queue_is_found_again(make_target, private_redis):  # noqa: F811
    default, other = unique("bq"), unique("bq-other")
    target = make_target(queue=default, prefix="ckbull")
    later = relay_job("later", 1, task="record", run_after=datetime.now(UTC) + timedelta(hours=1))
    target_id = target.publish(later, Delivery(queue=other))
    assert target_id == f"{other}/{bullmq_job_id(later.key)}"
    client = private_redis.client()
    assert client.zcard(f"ckbull:{other}:delayed") == 1 and not client.keys("bull:*")
    assert target.status(target_id) == Completion.PENDING
    # A relay restarted later finds it from the stored target id alone.
    assert make_target(queue=default, prefix="ckbull").status(target_id) == Completion.PENDING


def test_redis_restarted_mid_run_loses_nothing(make_target, start_worker, private_redis, tmp_path):  # noqa: F811
    queue = unique("bq")
    target = make_target(queue=queue, socket_timeout=2)
    start_worker(queue)
    first = relay_job("outage", 1, task="record")
    target.publish(first, Delivery())
    wait_for(lambda: len(ran(tmp_path)) == 1, 60, "the first job")
    first_id = bullmq_job_id(first.key)
    wait_for(lambda: target.status(first_id) == Completion.SUCCEEDED, 60, "its completion")
    assert target.status_many([first_id, "ck-nope"]) == [Completion.SUCCEEDED, Completion.UNKNOWN]
    private_redis.stop()
    assert target.status_many([first_id]) == [Completion.UNKNOWN]  # a poll must not raise
    second = relay_job("outage", 2, task="record")
    with pytest.raises(PublishError) as failure:
        target.publish(second, Delivery())
    assert not isinstance(failure.value, PermanentPublishError)
    private_redis.start()
    wait_for(lambda: _publishes(target, second), 60, "a publish after the restart")
    wait_for(lambda: len(ran(tmp_path)) == 2, 120, "the worker to reconnect and run it")
    assert [i for i, _ in ran(tmp_path)] == [bullmq_job_id(first.key), bullmq_job_id(second.key)]


def _publishes(target, job) -> bool:
    """The relay's retry: a publish that may fail while the client reconnects."""
    try:
        target.publish(job, Delivery())
    except PublishError:
        return False
    return True


@pytest.mark.parametrize("bad", ["12", "-3", "a:b", ""])
def test_ids_bullmq_refuses_are_refused_before_sending(bad):
    with pytest.raises(PermanentPublishError, match="refuses the job id"):
        bullmq_target.check_job_id(bad)


@given(st.text(min_size=1, max_size=60))
def test_every_key_makes_an_id_bullmq_accepts(key):
    assert bullmq_target.check_job_id(bullmq_job_id(key)) == bullmq_job_id(key)
    assert unsafe_id(bullmq_job_id(key).removeprefix("ck-")) == key


def test_keep_completed_below_a_relay_lease_is_refused(private_redis):  # noqa: F811
    with pytest.raises(TargetConfigError, match="'keep_completed' must be whole seconds >= 60"):
        bullmq_target.build("b", {"kind": "bullmq", "redis": private_redis.url,
                                  "keep_completed": 5})
    with pytest.raises(TargetConfigError, match="'prefix'"):
        bullmq_target.build("b", {"kind": "bullmq", "prefix": "a:b"})


def test_publish_many_adds_in_bulk_counts_duplicates_and_reports_a_bad_option(
        make_target, private_redis):  # noqa: F811
    queue = unique("bq")
    target = make_target(queue=queue)
    jobs = [relay_job("bulk", n, task="record") for n in range(4)]
    target.publish(jobs[0], Delivery())
    again = dataclasses.replace(jobs[0], attempt=2)
    results = target.publish_many([
        (again, Delivery()), (jobs[1], Delivery()),
        (jobs[2], Delivery(options=(("keep_completed", 1),))), (jobs[3], Delivery())])
    assert results[0] == bullmq_job_id(jobs[0].key) and results[1] == bullmq_job_id(jobs[1].key)
    assert isinstance(results[2], PublishError) and "keep_completed" in str(results[2])
    assert results[3] == bullmq_job_id(jobs[3].key)
    assert target.duplicates == 1
    waiting = private_redis.client().lrange(f"bull:{queue}:wait", 0, -1)
    assert sorted(w.decode() for w in waiting) == sorted(
        bullmq_job_id(j.key) for j in (jobs[0], jobs[1], jobs[3]))
