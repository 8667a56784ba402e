"""The RQ target against a real Redis and a real ``rq worker`` process (SPEC §11, issue 8).

Each test has a private redis-server, so stopping it mid-run touches nobody else's data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from relay_support import (  # noqa: F401 - private_redis is a fixture
    consumer_env,
    effects,
    private_redis,
    relay_job,
    rq_worker,
    unique_name,
    wait_for,
)

from cronkeeper.relay.targets import rq as rq_target
from cronkeeper.relay.targets._redis import TargetConfigError
from cronkeeper.relay.targets.base import (
    Completion,
    Delivery,
    PermanentPublishError,
    PublishError,
    TargetUnavailable,
    rq_job_id,
    unsafe_id,
)


def run_worker(url: str, queue: str, effects_file: Path) -> None:
    """One burst of a real ``rq worker``: it runs every queued job, then exits."""
    proc = rq_worker(url, queue, effects_file, burst=True)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]


@pytest.fixture
def target(private_redis):  # noqa: F811
    t = rq_target.build("rq-test", {"kind": "rq", "redis": private_redis.url})
    yield t
    t.close()


def test_every_published_job_runs_once_on_a_real_worker(target, private_redis, tmp_path):  # noqa: F811
    queue = unique_name("rq")
    out = tmp_path / "effects"
    jobs = [relay_job("every-minute", n, payload={"n": n, "region": "us"}) for n in range(5)]
    ids = [target.publish(job, Delivery(queue=queue)) for job in jobs]
    assert ids == [rq_job_id(job.key) for job in jobs]
    assert [unsafe_id(i) for i in ids] == [job.key for job in jobs]
    assert {target.status(i) for i in ids} == {Completion.PENDING}

    run_worker(private_redis.url, queue, out)

    lines = effects(out)
    assert sorted(lines) == sorted(f'{job.key} {{"n": {job.id}, "region": "us"}}' for job in jobs)
    assert {target.status(i) for i in ids} == {Completion.SUCCEEDED}


def test_a_republish_of_the_same_job_is_absorbed_by_unique(target, private_redis, tmp_path):  # noqa: F811
    """The relay's crash window: published, not marked, published again with the same id. RQ
    refuses the duplicate (unique=True) before the job ran and after it finished."""
    queue = unique_name("rq")
    out = tmp_path / "effects"
    job = relay_job("crashy", 1)
    first = target.publish(job, Delivery(queue=queue))
    assert target.publish(job, Delivery(queue=queue)) == first  # before it ran
    assert private_redis.client().llen(f"rq:queue:{queue}") == 1
    run_worker(private_redis.url, queue, out)
    assert target.publish(job, Delivery(queue=queue)) == first  # after it finished
    run_worker(private_redis.url, queue, out)
    assert effects(out) == [f'{job.key} {{"n": 1}}']


def test_status_reports_failure_and_forgets_what_rq_expired(target, private_redis, tmp_path):  # noqa: F811
    queue = unique_name("rq")
    bad = relay_job("broken", 1, task="relay_consumers:fail")
    failed_id = target.publish(bad, Delivery(queue=queue))
    run_worker(private_redis.url, queue, tmp_path / "effects")
    assert target.status(failed_id) == Completion.FAILED
    assert target.status(rq_job_id("never@2026-01-01T00:00:00Z")) == Completion.UNKNOWN

    client = private_redis.client()
    kept = target.publish(relay_job("kept", 2), Delivery(queue=queue))
    short_id = target.publish(relay_job("short-lived", 3),
                              Delivery(queue=queue, options=(("result_ttl", 600),)))
    run_worker(private_redis.url, queue, tmp_path / "effects")
    assert target.status(short_id) == Completion.SUCCEEDED
    # result_ttl: the target's default keeps a finished job a day, a route may shorten it.
    assert 3600 < client.ttl(f"rq:job:{kept}") <= rq_target.DEFAULT_RESULT_TTL
    assert 0 < client.ttl(f"rq:job:{short_id}") <= 600
    # What the docs warn about: once RQ expired the job, the id is unknown (and free) again.
    client.delete(f"rq:job:{short_id}")
    assert target.status(short_id) == Completion.UNKNOWN


def test_run_after_in_the_future_goes_to_rqs_scheduler(target, private_redis):  # noqa: F811
    queue = unique_name("rq")
    later = relay_job("deferred", 1, run_after=datetime.now(UTC) + timedelta(hours=1))
    job_id = target.publish(later, Delivery(queue=queue))
    client = private_redis.client()
    assert client.llen(f"rq:queue:{queue}") == 0
    assert client.zscore(f"rq:scheduled:{queue}", job_id) is not None
    assert target.status(job_id) == Completion.PENDING
    assert target.publish(later, Delivery(queue=queue)) == job_id  # unique holds for enqueue_at
    assert client.zcard(f"rq:scheduled:{queue}") == 1


def test_redis_down_fails_the_publish_and_a_retry_after_restart_loses_nothing(
    target, private_redis, tmp_path  # noqa: F811
):
    queue = unique_name("rq")
    out = tmp_path / "effects"
    first_id = target.publish(relay_job("outage", 1), Delivery(queue=queue))
    run_worker(private_redis.url, queue, out)
    assert target.status_many([first_id, "nope"]) == [Completion.SUCCEEDED, Completion.UNKNOWN]
    private_redis.stop()
    # A completion poll while Redis is down answers UNKNOWN: it must not stop the relay.
    assert target.status_many([first_id, "nope"]) == [Completion.UNKNOWN, Completion.UNKNOWN]
    second = relay_job("outage", 2)
    with pytest.raises(TargetUnavailable) as failure:  # the relay rests the target, retries
        target.publish(second, Delivery(queue=queue))
    assert "rq-test" in str(failure.value) and "Redis unreachable" in str(failure.value)
    private_redis.start()  # an empty Redis: what a crash without persistence leaves
    target.publish(second, Delivery(queue=queue))  # the relay's retry, same id
    run_worker(private_redis.url, queue, out)
    assert [line.split()[0] for line in effects(out)] == [relay_job("outage", n).key for n in (1, 2)]


@pytest.mark.parametrize("task", ["send", "billing jobs.send", "billing.jobs:send:now", ""])
def test_a_task_rq_cannot_import_is_a_permanent_failure(target, task):
    with pytest.raises(PermanentPublishError, match="dotted function path"):
        target.publish(relay_job("x", 1, task=task), Delivery(queue="q"))


def test_task_spellings_map_to_rqs_dotted_path():
    assert rq_target.function_name("billing.jobs:send") == "billing.jobs.send"
    assert rq_target.function_name("billing.jobs.send") == "billing.jobs.send"


def test_bad_settings_are_refused_with_a_suggestion():
    with pytest.raises(TargetConfigError, match="unknown setting 'reddis' \\(did you mean 'redis'\\?\\)"):
        rq_target.build("rq-x", {"kind": "rq", "reddis": "redis://127.0.0.1:1/0"})
    with pytest.raises(TargetConfigError, match="'result_ttl' must be a whole number >= 1"):
        rq_target.build("rq-x", {"kind": "rq", "result_ttl": "1d"})
    # What `cronkeeper validate --relay-config` reports: every problem, by key.
    assert rq_target.check({"kind": "rq", "redis": "http://x", "queue": "", "at_front": 1}) == [
        ("at_front", "unknown setting 'at_front' (known: failure_ttl, kind, queue, redis, "
                     "result_ttl, socket_timeout)"),
        ("redis", "'redis' must be a redis://, rediss:// or unix:// URL, not 'http://x'"),
        ("queue", "'queue' must be a non-empty string, not ''"),
    ]


def test_a_wrong_route_option_fails_the_publish_retryably(target):
    with pytest.raises(PublishError, match="unknown setting 'resut_ttl'") as failure:
        target.publish(relay_job("x", 1), Delivery(queue="q", options=(("resut_ttl", 5),)))
    assert not isinstance(failure.value, PermanentPublishError)
