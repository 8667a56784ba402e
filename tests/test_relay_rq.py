"""The RQ target against a real Redis and a real ``rq worker`` process (SPEC §11, issue 8).

Each test has a private redis-server, so stopping it mid-run touches nobody else's data."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from conftest import scalar
from handlers_for_tests import wait_until
from relay_helpers import (  # noqa: F401 - private_redis is a fixture
    RelayThread,
    consumer_env,
    effects,
    private_redis,
    put,
    relay_job,
    rq_worker,
    unique,
    wait_for,
    write_config,
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
    queue = unique("rq")
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
    queue = unique("rq")
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
    queue = unique("rq")
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
    queue = unique("rq")
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
    queue = unique("rq")
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


# -- publish_many: a relay round in one pipelined round trip ---------------------------------


def test_publish_many_saves_each_job_exactly_as_enqueue_call_does(private_redis):  # noqa: F811
    """The batch path runs RQ's own unique-enqueue script with RQ's own job fields: the same job
    published one by one (``enqueue_call``, database 0) and in a batch (database 1) leaves the
    same hash, TTL, queue list and queue registry, timestamps aside. Guards against an RQ release
    that changes what enqueue_call saves."""
    single = rq_target.build("rq-single", {"kind": "rq", "redis": private_redis.url})
    batch = rq_target.build("rq-batch", {"kind": "rq",
                                         "redis": private_redis.url.replace("/0", "/1")})
    try:
        queue = unique("rq")
        jobs = [relay_job("same", 1, payload={"n": 1, "region": "eu"}),
                relay_job("same", 2, timeout=0)]  # no timeout: RQ's default
        routes = [Delivery(queue=queue, options=(("result_ttl", 600), ("at_front", True))),
                  Delivery(queue=queue)]
        for job, delivery in zip(jobs, routes, strict=True):
            single.publish(job, delivery)
        assert batch.publish_many(list(zip(jobs, routes, strict=True))) == [
            rq_job_id(j.key) for j in jobs]
        db0, db1 = private_redis.client(), redis_db(private_redis, 1)
        for job in jobs:
            key = f"rq:job:{rq_job_id(job.key)}"
            one, many = db0.hgetall(key), db1.hgetall(key)
            stamps = {b"created_at", b"enqueued_at"}
            assert stamps <= set(one) and stamps <= set(many)
            assert {k: v for k, v in many.items() if k not in stamps} == {
                k: v for k, v in one.items() if k not in stamps}
            assert db1.ttl(key) == db0.ttl(key) == -1  # RQ sets no TTL on a queued job
        assert db1.lrange(f"rq:queue:{queue}", 0, -1) == db0.lrange(f"rq:queue:{queue}", 0, -1)
        assert db1.smembers("rq:queues") == db0.smembers("rq:queues") == {
            f"rq:queue:{queue}".encode()}
    finally:
        single.close()
        batch.close()


def redis_db(server, db: int):
    import redis

    return redis.Redis.from_url(server.url.replace("/0", f"/{db}"))


def test_publish_many_lands_each_job_once_and_fails_a_broken_one_alone(
    target, private_redis, tmp_path  # noqa: F811
):
    """One batch: a job RQ already holds (a republish), good jobs, a job with a wrong route
    option, a task RQ cannot import, a job whose queue key Redis refuses (WRONGTYPE inside RQ's
    script) and one due later (``enqueue_at``). Each gets its own outcome; the good ones run
    once each on a real worker."""
    queue, broken = unique("rq"), unique("rq-broken")
    client = private_redis.client()
    client.set(f"rq:queue:{broken}", "not a list")
    jobs = [relay_job("batch", n) for n in range(7)]
    jobs[3] = relay_job("batch", 3, task="no_module_path")
    jobs[5] = relay_job("batch", 5, run_after=datetime.now(UTC) + timedelta(hours=1))
    target.publish(jobs[0], Delivery(queue=queue))  # landed before: the relay crashed
    deliveries = [Delivery(queue=queue)] * 7
    deliveries[2] = Delivery(queue=queue, options=(("resut_ttl", 5),))
    deliveries[4] = Delivery(queue=broken)
    results = target.publish_many(list(zip(jobs, deliveries, strict=True)))

    ok = {0, 1, 5, 6}
    assert [results[i] for i in sorted(ok)] == [rq_job_id(jobs[i].key) for i in sorted(ok)]
    assert isinstance(results[2], PublishError) and "resut_ttl" in str(results[2])
    assert not isinstance(results[2], PermanentPublishError)
    assert isinstance(results[3], PermanentPublishError)
    assert isinstance(results[4], PublishError) and "WRONGTYPE" in str(results[4])
    assert not isinstance(results[4], TargetUnavailable)
    # in claim order, the republished job once
    assert client.lrange(f"rq:queue:{queue}", 0, -1) == [
        rq_job_id(jobs[i].key).encode() for i in (0, 1, 6)]
    assert client.zscore(f"rq:scheduled:{queue}", rq_job_id(jobs[5].key)) is not None
    for i in (2, 3):
        assert not client.exists(f"rq:job:{rq_job_id(jobs[i].key)}")

    out = tmp_path / "effects"
    run_worker(private_redis.url, queue, out)
    assert sorted(effects(out)) == sorted(f'{jobs[i].key} {{"n": {i}}}' for i in (0, 1, 6))
    assert target.status_many([rq_job_id(jobs[i].key) for i in (0, 1, 6)]) == [
        Completion.SUCCEEDED] * 3


def test_publish_many_loads_the_script_again_when_redis_lost_it(target, private_redis):  # noqa: F811
    """The batch sends RQ's script by SHA only; after SCRIPT FLUSH (or a Redis restart) Redis
    answers NOSCRIPT, which ran nothing: the target loads the script and sends those jobs
    again, and each lands once."""
    queue = unique("rq")
    client = private_redis.client()
    first = [relay_job("flushed", n) for n in range(3)]
    assert target.publish_many([(j, Delivery(queue=queue)) for j in first]) == [
        rq_job_id(j.key) for j in first]
    client.script_flush()
    second = [relay_job("flushed", n) for n in range(2, 6)]  # one republished (n=2)
    assert target.publish_many([(j, Delivery(queue=queue)) for j in second]) == [
        rq_job_id(j.key) for j in second]
    assert client.lrange(f"rq:queue:{queue}", 0, -1) == [
        rq_job_id(relay_job("flushed", n).key).encode() for n in range(6)]


def test_publish_many_with_redis_down_fails_as_a_whole_and_loses_nothing(
    target, private_redis, tmp_path  # noqa: F811
):
    queue = unique("rq")
    jobs = [relay_job("outage-batch", n) for n in range(3)]
    assert target.publish_many([(jobs[0], Delivery(queue=queue))]) == [rq_job_id(jobs[0].key)]
    private_redis.stop()
    with pytest.raises(TargetUnavailable, match="Redis unreachable"):
        target.publish_many([(j, Delivery(queue=queue)) for j in jobs])
    private_redis.start()  # empty: the first job is gone with the crash, so it goes again
    assert target.publish_many([(j, Delivery(queue=queue)) for j in jobs]) == [
        rq_job_id(j.key) for j in jobs]
    out = tmp_path / "effects"
    run_worker(private_redis.url, queue, out)
    assert sorted(line.split()[0] for line in effects(out)) == sorted(j.key for j in jobs)


def test_publish_many_goes_one_by_one_on_an_rq_without_the_script(target, private_redis):  # noqa: F811
    """What an RQ release without ``rq.scripts``' pieces gets: every job through
    ``enqueue_call``, the same outcomes."""
    target._parts = None
    queue = unique("rq")
    jobs = [relay_job("fallback", n) for n in range(3)]
    target.publish(jobs[1], Delivery(queue=queue))
    results = target.publish_many([(j, Delivery(queue=queue)) for j in jobs]
                                  + [(relay_job("fallback", 3, task="nope"), Delivery(queue=queue))])
    assert results[:3] == [rq_job_id(j.key) for j in jobs]
    assert isinstance(results[3], PermanentPublishError)
    assert private_redis.client().lrange(f"rq:queue:{queue}", 0, -1) == [
        rq_job_id(jobs[i].key).encode() for i in (1, 0, 2)]


def relay_config(url: str, queue: str, *, first_route: str = "") -> str:
    """A relay with one RQ target ``t`` (default queue ``queue``): ``first_route`` (TOML), then
    every ``relay_consumers`` task to ``t``."""
    return f"""
name = "{unique('relay')}"
lease = "30s"
poll_interval = "0.05s"
status_interval = "0.2s"

[targets.t]
kind = "rq"
redis = "{url}"
queue = "{queue}"
{first_route}
[[routes]]
tasks = ["relay_consumers.*"]
target = "t"
"""


def test_a_relay_round_marks_the_jobs_redis_took_and_retries_the_one_it_refused(
    engine, schema, private_redis, tmp_path  # noqa: F811
):
    """The relay loop over the batch path: one round of twelve jobs, one of them routed to a
    queue Redis refuses (WRONGTYPE inside RQ's script). The eleven are marked published, each in
    RQ once; the one is a failed attempt, back to available with its error, not published."""
    queue, broken = unique("rq"), unique("rq-broken")
    client = private_redis.client()
    client.set(f"rq:queue:{broken}", "not a list")
    keys = [f"round@2026-03-08T07:{n:02d}:00Z" for n in range(12)]
    for n, key in enumerate(keys):
        task = "relay_consumers.fail" if n == 5 else "relay_consumers.record"
        put(engine, schema, task, {"n": n}, key=key)
    config = write_config(tmp_path, relay_config(private_redis.url, queue, first_route=f"""
[[routes]]
tasks = ["relay_consumers.fail"]
target = "t"
queue = "{broken}"
"""))
    with RelayThread(engine, schema, config) as relay:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE last_error IS NOT NULL"
                                  " OR state = 'published'") == 12, message="twelve outcomes")
        assert relay.relay.stats["claimed"] >= 12
    published = scalar(engine, "SELECT array_agg(idempotency_key ORDER BY id) FROM outbox "
                               "WHERE state = 'published' AND target_id IS NOT NULL")
    assert published == [k for n, k in enumerate(keys) if n != 5]
    with engine.connect() as conn:
        state, attempts, error = conn.execute(sa.text(
            "SELECT state, attempts, last_error FROM outbox WHERE idempotency_key = :k"),
            {"k": keys[5]}).one()
    assert (state, attempts) == ("available", 1) and "WRONGTYPE" in error
    assert client.lrange(f"rq:queue:{queue}", 0, -1) == [
        rq_job_id(k).encode() for n, k in enumerate(keys) if n != 5]
    # the batch path: one pipeline per round, not RQ's MULTI/EXEC per job
    assert "cmdstat_exec" not in client.info("commandstats")


class _UnreachableForOne(rq_target.RQTarget):
    """A real RQ target whose batch lands every job, then reports one of them as if Redis had
    gone away before it (what a job sent one by one after the pipeline, ``enqueue_at``, meets
    when Redis dies between the two)."""

    def __init__(self, *args, fail_key: str) -> None:
        super().__init__(*args)
        self.fail_key = fail_key

    def publish_many(self, items):
        results = super().publish_many(items)
        return [TargetUnavailable("Redis unreachable (injected)") if job.key == self.fail_key
                else result for (job, _), result in zip(items, results, strict=True)]


def test_jobs_a_batch_landed_are_marked_even_when_another_found_the_target_down(
    engine, schema, private_redis, tmp_path  # noqa: F811
):
    """The relay rests a target that one job of a round found unreachable; the jobs of the same
    round that the target had already taken are still marked published (they are in RQ), and
    only that one job is handed back, uncounted."""
    from cronkeeper.cli.relay import load_config
    from cronkeeper.relay.loop import Relay

    queue = unique("rq")
    keys = [f"rest@2026-03-08T07:{n:02d}:00Z" for n in range(6)]
    for n, key in enumerate(keys):
        put(engine, schema, "relay_consumers.record", {"n": n}, key=key)
    config = load_config(write_config(tmp_path, relay_config(private_redis.url, queue)))
    target = _UnreachableForOne("t", {"kind": "rq", "redis": private_redis.url, "queue": queue},
                                fail_key=keys[2])
    relay = Relay(engine, config, {"t": target}, relay_id=unique("relay"), schema=schema)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'published'")
                   == 5, message="five published")
    finally:
        relay.stop()
        thread.join(30)
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.text(
            "SELECT idempotency_key, state || '/' || attempts FROM outbox")).all())
    assert rows == {k: ("available/0" if k == keys[2] else "published/1") for k in keys}
