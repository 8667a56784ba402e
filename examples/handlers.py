"""The quick start's task handlers: what `cronkeeper run --with-worker` runs for the example
schedules in examples/schedules/, so that a newcomer sees a job run end to end.

A handler is a function marked with ``@task``; the worker finds it by the import path the
schedule names (``examples.handlers:hello``). It gets the payload and a job context (key,
attempt, schedule, scheduled_for) and must be safe to run twice: delivery is at least once.
"""

from __future__ import annotations

import logging

from cronkeeper.worker import task

log = logging.getLogger("cronkeeper.examples")


@task()
def hello(payload: dict, ctx) -> None:
    """Says hello. Idempotent: it only logs."""
    log.info("%s from cronkeeper: job %s ran (attempt %d); `cronkeeper web` shows it in the "
             "strip of %s", payload.get("greeting", "hello"), ctx.key, ctx.attempt, ctx.schedule,
             extra={"action": "example_hello"})


class NotYet(Exception):
    """A retryable failure (any exception not marked permanent is retried with backoff)."""


@task()
def flaky(payload: dict, ctx) -> None:
    """Fails its first attempt on purpose, then succeeds: a retry with backoff and jitter."""
    if ctx.attempt < int(payload.get("succeed_on", 2)):
        raise NotYet(f"attempt {ctx.attempt} fails on purpose; the worker retries it")
    log.info("job %s succeeded on attempt %d after a retry", ctx.key, ctx.attempt,
             extra={"action": "example_flaky"})
