"""The quick start's task handlers: what `cronkeeper run --with-worker` runs for the example
schedules in examples/schedules/, so that a newcomer sees a job run end to end.

A handler is a function marked with ``@task``; the worker finds it by the import path the
schedule names (``examples.handlers:hello``). It gets the payload and a job context (key,
attempt, schedule, scheduled_for) and must be safe to run twice: delivery is at least once.
"""

from __future__ import annotations

import logging

from cronkeeper.worker import task

# A logger of the application's own (not under "cronkeeper", whose records stop at cronkeeper's
# own log): the records a handler emits while it runs are kept with its attempt, so
# `cronkeeper output KEY` and `cronkeeper explain KEY` show them (docs/worker.md, "What a job
# printed"). The print beside each is only for the quick start's terminal: a thread's print
# goes to the worker's stdout, and is not kept.
log = logging.getLogger(__name__)


@task()
def hello(payload: dict, ctx) -> None:
    """Says hello. Idempotent: it only logs."""
    said = (f"{payload.get('greeting', 'hello')} from cronkeeper: job {ctx.key} ran (attempt "
            f"{ctx.attempt}); `cronkeeper web` shows it in the strip of {ctx.schedule}")
    log.info("%s", said)
    print(said, flush=True)


class NotYet(Exception):
    """A retryable failure (any exception not marked permanent is retried with backoff)."""


@task()
def flaky(payload: dict, ctx) -> None:
    """Fails its first attempt on purpose, then succeeds: a retry with backoff and jitter."""
    if ctx.attempt < int(payload.get("succeed_on", 2)):
        raise NotYet(f"attempt {ctx.attempt} fails on purpose; the worker retries it")
    said = f"job {ctx.key} succeeded on attempt {ctx.attempt} after a retry"
    log.info("%s", said)
    print(said, flush=True)
