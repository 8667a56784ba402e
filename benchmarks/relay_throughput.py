"""Relay throughput: N jobs committed to the outbox in one transaction, relayed to a broker by
``cronkeeper relay`` (in-process, the same code as the command), side by side in the same run with
the floor: a bare loop of the queue library's own publish call with the same delivery settings.

    .venv/bin/python benchmarks/relay_throughput.py --jobs 10000 --target celery \\
        --database-url postgresql://postgres@127.0.0.1:5432/test

Measured per system: jobs/s (N over the time from the commit, or the floor's start, until the
last job is published and, for the relay, marked), and p50/p99 of the latency from commit to the
broker's acknowledgement of each job (the relay's ``cronkeeper_relay_publish_lag_seconds``
values; for the floor, from the loop's start to each acknowledgement: every job was ready then).
Prints the relay's ratio to the floor (target: at least 0.70). The systems run in interleaved
rounds (``--rounds``, default 3) and the table shows each one's median round. On a shared,
loaded machine the broker's confirm latency swings by 2x between consecutive runs, more than
the relay's own cost; so the script also prints, per relay run, the share of its wall time spent
inside the library's publish call: the relay's efficiency against the floor measured within the
same run.

Rows: ``floor`` (the library, at its best settings below), ``relay-defaults`` (the config's
defaults: batch_size 100), ``relay-tuned`` (batch_size 1000).

Targets plug in through ``TARGETS``: a target is its relay config table, its floor (publish the
same jobs with the bare library and return each job's acknowledgement time) and a cleanup. The
Celery floor uses what Celery and kombu document for reliable fast publishing: one connection
and one producer reused for every message (Celery's docs, "Connections" in the calling guide:
pass ``producer=``), RabbitMQ publisher confirms (kombu's py-amqp transport option
``confirm_publish``, as Celery's ``broker_transport_options`` docs show) and ``mandatory``, with
``retry=False``, exactly the settings the relay's Celery target publishes with, so the ratio is
the relay's own cost (claim, mark, bookkeeping) and nothing else.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cronkeeper import metrics  # noqa: E402
from cronkeeper.cli.relay import build_targets, load_config  # noqa: E402
from cronkeeper.db.engine import make_engine, normalize_url  # noqa: E402
from cronkeeper.db.migrate import migrate  # noqa: E402
from cronkeeper.relay.loop import Relay  # noqa: E402
from cronkeeper.relay.targets.base import RelayJob  # noqa: E402

TASK = "bench.noop"


@dataclass(frozen=True)
class TargetBench:
    """How to benchmark one target kind."""

    broker: str
    table: Callable[[str], str]  # broker URL -> the [targets.bench] body (kind included)
    floor: Callable[[str, str, list[RelayJob]], list[float]]  # (broker, queue, jobs) -> ack times
    cleanup: Callable[[str, str], None]  # (broker, queue)


# -- Celery -------------------------------------------------------------------------------------

def celery_table(broker: str) -> str:
    return f'kind = "celery"\nbroker = "{broker}"\n'


def celery_floor(broker: str, queue: str, jobs: list[RelayJob]) -> list[float]:
    from celery import Celery
    from kombu import Producer

    app = Celery("bench-floor", broker=broker, set_as_current=False)
    conn = app.connection_for_write(transport_options={"confirm_publish": True})
    conn.ensure_connection(max_retries=1)
    amqp = conn.transport.driver_type == "amqp"
    producer = Producer(conn.default_channel)
    extra = {"mandatory": True, "confirm_timeout": 10.0} if amqp else {}
    acks = []
    for job in jobs:
        app.send_task(job.task, kwargs=job.payload, task_id=job.key, queue=queue,
                      headers={"idempotency_key": job.key, "cronkeeper_schedule": None,
                               "cronkeeper_scheduled_for": None},
                      producer=producer, retry=False, **extra)
        acks.append(time.monotonic())
    conn.release()
    return acks


def celery_cleanup(broker: str, queue: str) -> None:
    from kombu import Connection, Queue

    with Connection(broker) as conn:
        Queue(queue, channel=conn.default_channel).delete()


TARGETS: dict[str, TargetBench] = {
    "celery": TargetBench("amqp://guest:guest@127.0.0.1:5672//", celery_table, celery_floor,
                          celery_cleanup),
}

# RQ, Sidekiq and BullMQ (benchmarks/relay_targets.py), on a private redis-server started on use.
import relay_targets  # noqa: E402

TARGETS.update({kind: TargetBench(*bench) for kind, bench in relay_targets.BENCHES.items()})


# -- the relay ------------------------------------------------------------------------------------

class _Capture(metrics.NullMetrics):
    """Keeps every publish lag the relay reports (the histogram's raw observations)."""

    def __init__(self) -> None:
        super().__init__()
        self.lags: list[float] = []

    def relay_published_one(self, target: str, lag_seconds: float) -> None:
        self.lags.append(lag_seconds)


def fill_outbox(url: str, schema: str, n: int) -> tuple[float, float]:
    """N jobs in one transaction. Returns the monotonic time of the commit, and the seconds from
    the rows' ``created_at`` (the transaction's start) to the commit, which the relay's lag
    (measured from ``created_at``) includes and this benchmark's commit-to-ack figure must not."""
    with psycopg.connect(url) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(
            "INSERT INTO outbox (idempotency_key, task, payload, timeout_seconds) "
            "SELECT 'bench-' || g, %s, jsonb_build_object('i', g), 60 FROM generate_series(1, %s) g",
            (TASK, n),
        )
        conn.commit()
        committed = time.monotonic()
        offset = conn.execute("SELECT extract(epoch FROM clock_timestamp() - max(created_at)) "
                              "FROM outbox").fetchone()[0]
        return committed, float(offset) - (time.monotonic() - committed)


SHARES: dict[int | None, list[float]] = {}  # per batch size: share of wall time in publish()


def _time_publishes(targets: dict) -> list[float]:
    """Wrap each target's publish to add up the seconds spent inside it: the library's own
    publish call (what the floor does) as a share of the relay's wall time says how close the
    relay runs to the floor at that moment's broker speed, whatever the neighbours do."""
    total = [0.0]
    for target in targets.values():
        inner = target.publish

        def timed(job, delivery, inner=inner):
            start = time.monotonic()
            try:
                return inner(job, delivery)
            finally:
                total[0] += time.monotonic() - start

        target.publish = timed
        if hasattr(target, "publish_many"):  # a round in one call (RQ, Sidekiq, BullMQ targets)
            many = target.publish_many

            def timed_many(items, many=many):
                start = time.monotonic()
                try:
                    return many(items)
                finally:
                    total[0] += time.monotonic() - start

            target.publish_many = timed_many
    return total


def run_relay(url: str, target: TargetBench, broker: str, queue: str, n: int,
              batch_size: int | None) -> tuple[float, list[float]]:
    schema = f"bench_relay_{uuid.uuid4().hex[:8]}"
    engine = make_engine(normalize_url(url), schema)
    migrate(engine, schema)
    body = f'name = "bench"\n{f"batch_size = {batch_size}" if batch_size else ""}\n' \
           f'[targets.bench]\n{target.table(broker)}\n' \
           f'[[routes]]\ntasks = ["bench.*"]\ntarget = "bench"\nqueue = "{queue}"\n'
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        fh.write(body)
    capture = _Capture()
    metrics._current = capture  # noqa: SLF001 - the benchmark reads raw observations
    try:
        committed, offset = fill_outbox(url, schema, n)
        config = load_config(fh.name)
        targets = build_targets(config)
        in_publish = _time_publishes(targets)
        relay = Relay(engine, config, targets, relay_id="bench-relay", schema=schema)
        thread = threading.Thread(target=relay.run, daemon=True)
        thread.start()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            while conn.execute("SELECT EXISTS (SELECT 1 FROM outbox WHERE state <> 'published')"
                               ).fetchone()[0]:
                time.sleep(0.02)
        elapsed = time.monotonic() - committed
        relay.stop()
        thread.join(30)
        assert len(capture.lags) == n, (len(capture.lags), n)
        SHARES.setdefault(batch_size, []).append(in_publish[0] / elapsed)
        return elapsed, [lag - offset for lag in capture.lags]
    finally:
        metrics._current = None  # noqa: SLF001
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        engine.dispose()
        target.cleanup(broker, queue)


def run_floor(target: TargetBench, broker: str, queue: str, n: int) -> tuple[float, list[float]]:
    now = datetime.now(UTC)
    jobs = [RelayJob(i, f"floor-{i}", None, None, TASK, {"i": i}, 1, 5, 60.0, now, now)
            for i in range(1, n + 1)]
    try:
        start = time.monotonic()
        acks = target.floor(broker, queue, jobs)
        return acks[-1] - start, [a - start for a in acks]
    finally:
        target.cleanup(broker, queue)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--target", choices=sorted(TARGETS), default="celery")
    parser.add_argument("--broker", default=None, help="default: the target's loopback broker")
    parser.add_argument("--tuned-batch-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds of pause before each run (the broker settles)")
    args = parser.parse_args()
    target = TARGETS[args.target]
    broker = args.broker or target.broker
    if broker == relay_targets.PRIVATE:
        broker = relay_targets.private_redis()
    url = args.database_url.replace("postgresql+psycopg://", "postgresql://")
    systems = (
        ("floor", lambda q: run_floor(target, broker, q, args.jobs)),
        ("relay-defaults", lambda q: run_relay(url, target, broker, q, args.jobs, None)),
        ("relay-tuned", lambda q: run_relay(url, target, broker, q, args.jobs,
                                            args.tuned_batch_size)),
    )
    # Rounds interleave the systems, so a noisy neighbour slows all of them alike, and rotate
    # their order; before each run the broker gets a pause to finish deleting the previous
    # run's queue (10,000 persistent messages), which otherwise slows whoever runs next: the
    # floor, which starts publishing at once, more than a relay, which first fills an outbox.
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in systems}
    for r in range(args.rounds):
        for name, run in systems[r % len(systems):] + systems[:r % len(systems)]:
            time.sleep(args.settle)
            elapsed, lags = run(f"bench-{uuid.uuid4().hex[:8]}")
            results[name].append((args.jobs / elapsed, pct(lags, 50), pct(lags, 99)))
        print(f"round {r + 1}: " + ", ".join(f"{name} {results[name][-1][0]:.0f}/s"
                                             for name, _ in systems), flush=True)
    floor_rate = statistics.median(x[0] for x in results["floor"])
    print(f"{args.jobs} jobs, target {args.target}, broker {broker.split('@')[-1]}, "
          f"{args.rounds} rounds (medians)")
    print(f"{'system':<16}{'jobs/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'vs floor':>10}")
    for name, _ in systems:
        rate = statistics.median(x[0] for x in results[name])
        p50 = statistics.median(x[1] for x in results[name])
        p99 = statistics.median(x[2] for x in results[name])
        print(f"{name:<16}{rate:>10.0f}{p50 * 1000:>10.0f}{p99 * 1000:>10.0f}{rate / floor_rate:>10.2f}")
    if args.target in relay_targets.PEERS:  # the queue's own client, beside the floor
        name, peer = relay_targets.PEERS[args.target]
        rate = peer(broker, args.jobs)
        if rate is not None:
            print(f"{name:<16}{rate:>10.0f}{'':>10}{'':>10}{rate / floor_rate:>10.2f}")
    print("share of the relay's wall time spent inside the library's publish call (1.00: the "
          "relay adds nothing to the floor's own work):")
    for size, shares in SHARES.items():
        name = "relay-defaults" if size is None else "relay-tuned"
        print(f"  {name:<16}" + " ".join(f"{x:.2f}" for x in shares)
              + f"  median {statistics.median(shares):.2f}")

if __name__ == "__main__":
    main()
