"""The handlers ``scripts/soak.py`` runs (workers import this module with ``--import``).

Each job's behaviour follows from its idempotency key (a hash), the same on every attempt and
every worker, so the checks can tell what should have happened:

- most jobs sleep a little (0 to 0.8 s, in slices) and succeed;
- ``FLAKY`` of them fail on their first attempt (retryable), ``SLOW_FIRST`` sleep past their
  timeout on the first attempt, ``PERMANENT`` raise a permanent error (dead letter at once);
- payload ``{"chain": n}`` enqueues a follow-up with ``ctx.enqueue`` (exists iff this completes).

Every run appends a line to the run log (a file per process under ``$SOAK_RUN_LOG``), before any
effect: that is what was *executed*. The effect itself is claimed with ``ctx.effect`` and, only
on the first claim, a row goes into ``soak_effects`` in the job's own transaction, naming the
worker and the attempt: that is what *took effect*, and it commits with the job's completion.
Every run that gets that far also writes a row to ``soak_completions`` in the same transaction,
whether or not the effect was already claimed: a row there exists iff that run's completion
committed, so a completion by a worker that had lost its lease cannot hide behind an effect
someone else already claimed.
"""

from __future__ import annotations

import hashlib
import os
import time

from cronkeeper.errors import PermanentError
from cronkeeper.worker import task

FLAKY = 0.10
SLOW_FIRST = 0.03
PERMANENT = 0.03


class Flaky(Exception):
    """A retryable failure (a 503 from a dependency)."""


def fate(key: str) -> float:
    """A number in [0, 1) fixed by the key."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def _log_run(key: str, attempt: int) -> None:
    directory = os.environ.get("SOAK_RUN_LOG")
    if not directory:
        return
    worker = os.environ.get("CRONKEEPER_INSTANCE_ID", "?")
    with open(os.path.join(directory, f"runs-{os.getpid()}.log"), "a") as f:
        f.write(f"{key}\t{attempt}\t{worker}\n")


@task("soak.work")
def work(payload, ctx):
    _log_run(ctx.key, ctx.attempt)
    f = fate(ctx.key)
    if f < PERMANENT:
        raise PermanentError(f"soak: job {ctx.key} is invalid by design")
    if f < PERMANENT + FLAKY and ctx.attempt == 1:
        raise Flaky("soak: dependency answered 503 (first attempt)")
    if f < PERMANENT + FLAKY + SLOW_FIRST and ctx.attempt == 1:
        deadline = time.monotonic() + float(payload.get("hang", 6))
        while time.monotonic() < deadline:  # past the job's timeout: killed or abandoned
            time.sleep(0.05)
    time.sleep((f * 1000 % 1) * float(payload.get("sleep", 0.8)))
    with ctx.effect(f"soak:{ctx.key}") as first:
        if first:
            ctx.connection.exec_driver_sql(
                "INSERT INTO soak_effects (job_key, worker_id, attempt, pid)"
                " VALUES (%(k)s, %(w)s, %(a)s, %(p)s)",
                {"k": ctx.key, "w": os.environ.get("CRONKEEPER_INSTANCE_ID", "?"),
                 "a": ctx.attempt, "p": os.getpid()},
            )
    # Unconditionally, in the same transaction: a row here exists iff this run's completion
    # committed (the worker commits the handler's transaction with the fenced completion).
    ctx.connection.exec_driver_sql(
        "INSERT INTO soak_completions (job_key, worker_id, attempt) VALUES (%(k)s, %(w)s, %(a)s)",
        {"k": ctx.key, "w": os.environ.get("CRONKEEPER_INSTANCE_ID", "?"), "a": ctx.attempt},
    )
    chain = int(payload.get("chain", 0))
    if chain > 0:
        ctx.enqueue("soak.work", {**payload, "chain": chain - 1}, key=f"{ctx.key}/{chain}",
                    timeout=float(payload.get("timeout", 3)), max_attempts=4,
                    backoff={"base": 0.3, "factor": 2, "max": 2})
