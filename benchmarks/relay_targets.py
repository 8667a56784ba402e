"""The RQ, Sidekiq and BullMQ targets for the relay benchmark (benchmarks/relay_throughput.py
``--target rq|sidekiq|bullmq``): each target's relay config table, its floor and its cleanup
(``BENCHES``, in relay_throughput's ``TargetBench`` order), plus Sidekiq's own Ruby client as a
peer row (``PEERS``),
against a private redis-server this module starts on a free loopback port (so cleaning up is
FLUSHALL on a Redis nobody else uses, and nothing else's keys slow it down).

Floors: a bare loop of the same client calls the target makes, with the client's best settings
for one-at-a-time publishing, so the ratio is the relay's own cost (claim, mark, bookkeeping):

- RQ: ``Queue.enqueue_call(..., job_id=..., unique=True)`` with the JSON serializer on one reused
  connection (RQ's docs, "Jobs": ``unique=True`` needs an explicit ``job_id``; ``enqueue_many``
  with a pipeline is RQ's bulk form, but RQ ignores the pipeline for unique jobs, so it would not
  dedupe and is not the same call).
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
PEERS = {"sidekiq": ("sidekiq-ruby", sidekiq_ruby_rate)}
