"""The RQ, Sidekiq and BullMQ targets for the relay benchmark (benchmarks/relay_throughput.py
``--target rq|sidekiq|bullmq``): each target's relay config table, its floor and its cleanup
(``BENCHES``, in relay_throughput's ``TargetBench`` order), plus a peer row beside the floor
(``PEERS``: Sidekiq's own Ruby client; RQ's batch path without the outbox),
against a private redis-server this module starts on a free loopback port (so cleaning up is
FLUSHALL on a Redis nobody else uses, and nothing else's keys slow it down).

Floors: a bare loop of the same client calls the target makes, with the client's best settings
for one-at-a-time publishing, so the ratio is the relay's own cost (claim, mark, bookkeeping):

- RQ: ``Queue.enqueue_call(..., job_id=..., unique=True)`` with the JSON serializer on one reused
  connection (RQ's docs, "Jobs": ``unique=True`` needs an explicit ``job_id``; ``enqueue_many``
  with a pipeline is RQ's bulk form, but RQ ignores the pipeline for unique jobs, so it would not
  dedupe and is not the same call). The relay's RQ target does not call ``enqueue_call``: it
  sends RQ's own unique-enqueue script for a whole round in one pipeline (``publish_many``), the
  same writes per job in one round trip per batch instead of two per job. So the relay can beat
  this floor; a second row, ``rq-batched``, times that batch path alone (the target's
  ``publish_many``, 100 jobs a call, no outbox), the relay's own ceiling.
- Sidekiq: what ``Sidekiq::Client#push`` sends (Sidekiq's wiki, "Job Format"): one MULTI/EXEC
  of ``SADD queues`` + ``LPUSH queue:<name>`` per job, through redis-py on one connection. A
  second floor row, ``sidekiq-ruby``, times the real ``Sidekiq::Client.push`` loop in Ruby
  (Debian's ruby-sidekiq), so the Python floor is seen beside Sidekiq's own client.
- BullMQ: ``await Queue.add(name, data, {"jobId": ..., "removeOnComplete": {"age": ...}})``
  one after another on one asyncio loop and one connection (BullMQ's docs, "Adding jobs";
  ``addBulk`` is its bulk form, a different call).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import socket
import subprocess
import tempfile
import time

from cronkeeper.relay.targets.base import RelayJob, bullmq_job_id, rq_job_id, sidekiq_jid

PRIVATE = "private-redis"  # the broker of these targets unless --broker names one
_SERVER: list = []


def private_redis() -> str:
    """A redis-server of the benchmark's own (started once per run), without persistence."""
    if not _SERVER:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        workdir = tempfile.mkdtemp(prefix="ck-bench-redis-")
        _SERVER.append(subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        atexit.register(_SERVER[0].kill)
        import redis

        client = redis.Redis(port=port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        _SERVER.append(port)  # type: ignore[arg-type]
    return f"redis://127.0.0.1:{_SERVER[1]}/0"


def flush(url: str, _queue: str) -> None:
    import redis

    redis.Redis.from_url(url).flushall()


# -- RQ ------------------------------------------------------------------------------------------

def rq_table(url: str) -> str:
    return f'kind = "rq"\nredis = "{url}"\n'


def rq_floor(url: str, queue: str, jobs: list[RelayJob]) -> list[float]:
    import redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    q = Queue(queue, connection=redis.Redis.from_url(url), serializer=JSONSerializer)
    acks = []
    for job in jobs:
        q.enqueue_call("bench.noop", kwargs=job.payload, job_id=rq_job_id(job.key), unique=True,
                       meta={"idempotency_key": job.key}, result_ttl=86400, timeout=60,
                       description=job.key)
        acks.append(time.monotonic())
    return acks


def rq_batched_rate(url: str, n: int) -> float:
    """jobs/s of the relay's RQ target alone: ``publish_many`` of 100 jobs a call (the relay's
    default batch size) in a bare loop, no outbox, claim or mark."""
    from datetime import UTC, datetime

    from cronkeeper.relay.targets import rq as rq_target
    from cronkeeper.relay.targets.base import Delivery

    target = rq_target.build("bench", {"kind": "rq", "redis": url})
    now = datetime.now(UTC)
    jobs = [RelayJob(i, f"batched-{i}", None, None, "bench.noop", {"i": i}, 1, 5, 60.0, now, now)
            for i in range(1, n + 1)]
    delivery = Delivery(queue="bench-batched")
    try:
        start = time.monotonic()
        for i in range(0, n, 100):
            results = target.publish_many([(job, delivery) for job in jobs[i:i + 100]])
            assert all(isinstance(r, str) for r in results), results
        return n / (time.monotonic() - start)
    finally:
        target.close()
        flush(url, "bench-batched")


# -- Sidekiq -------------------------------------------------------------------------------------

def sidekiq_table(url: str) -> str:
    return f'kind = "sidekiq"\nredis = "{url}"\n'


def sidekiq_floor(url: str, queue: str, jobs: list[RelayJob]) -> list[float]:
    import redis

    client = redis.Redis.from_url(url)
    acks = []
    for job in jobs:
        now = time.time()
        body = json.dumps({"class": job.task, "args": [job.payload], "jid": sidekiq_jid(job.key),
                           "queue": queue, "retry": True, "created_at": now,
                           "idempotency_key": job.key, "enqueued_at": now},
                          separators=(",", ":"))
        pipe = client.pipeline(transaction=True)
        pipe.sadd("queues", queue)
        pipe.lpush(f"queue:{queue}", body)
        pipe.execute()
        acks.append(time.monotonic())
    return acks


RUBY_PUSH = """
require "sidekiq"
n = Integer(ARGV[0]); q = ARGV[1]
Sidekiq.redis { |c| c.ping }
t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
n.times { |i| Sidekiq::Client.push("class" => "BenchJob", "queue" => q, "args" => [{"i" => i}]) }
puts Process.clock_gettime(Process::CLOCK_MONOTONIC) - t
"""


def sidekiq_ruby_rate(url: str, n: int) -> float | None:
    """jobs/s of Sidekiq's own client (push, one at a time), or None without Ruby Sidekiq."""
    try:
        done = subprocess.run(["ruby", "-e", RUBY_PUSH, str(n), "bench-ruby"], capture_output=True,
                              text=True, timeout=600, env={"REDIS_URL": url, "PATH": "/usr/bin:/bin"})
    except FileNotFoundError:
        return None
    if done.returncode != 0:
        return None
    flush(url, "bench-ruby")
    return n / float(done.stdout.strip().splitlines()[-1])


# -- BullMQ --------------------------------------------------------------------------------------

def bullmq_table(url: str) -> str:
    return f'kind = "bullmq"\nredis = "{url}"\n'


def bullmq_floor(url: str, queue: str, jobs: list[RelayJob]) -> list[float]:
    async def run() -> list[float]:
        import redis.asyncio as aredis
        from bullmq import Queue

        conn = aredis.Redis.from_url(url, decode_responses=True)
        q = Queue(queue, {"connection": conn})
        acks = []
        for job in jobs:
            await q.add(job.task, job.payload, {"jobId": bullmq_job_id(job.key),
                                                "removeOnComplete": {"age": 86400}})
            acks.append(time.monotonic())
        await conn.aclose()
        return acks

    return asyncio.run(run())




BENCHES = {
    "rq": (PRIVATE, rq_table, rq_floor, flush),
    "sidekiq": (PRIVATE, sidekiq_table, sidekiq_floor, flush),
    "bullmq": (PRIVATE, bullmq_table, bullmq_floor, flush),
}
PEERS = {"sidekiq": ("sidekiq-ruby", sidekiq_ruby_rate), "rq": ("rq-batched", rq_batched_rate)}
