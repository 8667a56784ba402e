"""Test your handlers the way the background-job rules demand, against a real database.

    from cronkeeper import testing

    def test_charge_runs_once(engine):               # an engine on a migrated cronkeeper schema
        testing.assert_runs_once(charge, {"invoice_id": 42}, engine=engine, schema="cronkeeper",
                                 count=lambda: fake_provider.charges)

    def test_provider_outage_is_retried(engine, monkeypatch):
        monkeypatch.setattr(provider, "charge", testing.raises(TimeoutError("gateway")))
        assert testing.classify(charge, {"invoice_id": 42}, engine=engine).retryable

Handlers run exactly as the worker runs them: the payload is checked against the handler's
declared shape, the context carries the idempotency helper, and the job's transaction commits
when the handler returns (rolls back when it raises). ``concurrently=True`` runs both calls at
the same time, the way duplicate delivery does. ``async def`` handlers are run the same way,
each call on an event loop of its own, with the awaitable context (``AsyncJobContext``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cronkeeper.db.engine import Engine
from cronkeeper.worker.async_context import AsyncJobContext, close_kept
from cronkeeper.worker.classify import Kind, exception_ending
from cronkeeper.worker.context import JobContext
from cronkeeper.worker.registry import Handler, TaskHandler

__all__ = ["Classification", "assert_permanent", "assert_retryable", "assert_runs_once",
           "classify", "raises", "run_handler", "run_twice"]


@dataclass(frozen=True, slots=True)
class Classification:
    """What the worker would do with the attempt: ``kind`` is succeeded, retryable or permanent."""

    kind: str
    error: str = ""
    exception: BaseException | None = None

    @property
    def retryable(self) -> bool:
        return self.kind == Kind.RETRYABLE

    @property
    def permanent(self) -> bool:
        return self.kind == Kind.PERMANENT


def _handler(handler: Handler | TaskHandler) -> TaskHandler:
    if isinstance(handler, TaskHandler):
        return handler
    marked = getattr(handler, "__cronkeeper_task__", None)
    return marked if isinstance(marked, TaskHandler) else TaskHandler(getattr(handler, "__name__", "handler"), handler)


def run_handler(
    handler: Handler | TaskHandler, payload: Any, *, engine: Engine | None = None,
    schema: str = "cronkeeper", key: str = "test@2026-01-01T00:00:00Z", attempt: int = 1,
    schedule: str | None = None, scheduled_for: datetime | None = None,
) -> Any:
    """Run a handler once as the worker would; returns its result, raises what it raises.
    An ``async def`` handler runs on an event loop of its own (``asyncio.run``), with an
    ``AsyncJobContext``: call this from a sync test."""
    th = _handler(handler)
    if th.is_async:
        return asyncio.run(_run_async(th, payload, key=key, attempt=attempt, schedule=schedule,
                                      scheduled_for=scheduled_for, task=th.name, schema=schema,
                                      engine=engine))
    ctx = JobContext(key=key, attempt=attempt, schedule=schedule, scheduled_for=scheduled_for,
                     task=th.name, schema=schema, engine=engine)
    try:
        result = th.func(th.prepare(payload), ctx)
    except BaseException:
        ctx.finish(commit=False)
        raise
    ctx.finish(commit=True)
    return result


async def _run_async(th: TaskHandler, payload: Any, **fields: Any) -> Any:
    ctx = AsyncJobContext(**fields)
    try:
        try:
            result = await th.func(th.prepare(payload), ctx)
        except BaseException:
            await ctx.finish(commit=False)
            raise
        await ctx.finish(commit=True)
        return result
    finally:
        await close_kept()  # this loop ends here: its connection with it


def run_twice(handler: Handler | TaskHandler, payload: Any, *, concurrently: bool = False,
              **kwargs: Any) -> list[Any]:
    """Deliver the same job twice (same key and payload), one after the other or at once."""
    if not concurrently:
        return [run_handler(handler, payload, attempt=n, **kwargs) for n in (1, 2)]
    results: list[Any] = [None, None]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def one(n: int) -> None:
        barrier.wait()
        try:
            results[n] = run_handler(handler, payload, attempt=n + 1, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def assert_runs_once(handler: Handler | TaskHandler, payload: Any, *, count: Callable[[], int],
                     concurrently: bool = False, **kwargs: Any) -> None:
    """Run the handler twice with one payload; ``count()`` (your effect) must grow by one."""
    before = count()
    run_twice(handler, payload, concurrently=concurrently, **kwargs)
    after = count()
    if after - before != 1:
        raise AssertionError(f"handler is not idempotent: two deliveries of one job made "
                             f"{after - before} effects (expected 1)")


def classify(handler: Handler | TaskHandler, payload: Any, **kwargs: Any) -> Classification:
    """Run once and say how the worker would classify the attempt."""
    try:
        run_handler(handler, payload, **kwargs)
    except Exception as exc:  # noqa: BLE001 - classified, not raised
        ending = exception_ending(exc)
        return Classification(str(ending.kind), ending.error, exc)
    return Classification(str(Kind.SUCCEEDED))


def assert_retryable(handler: Handler | TaskHandler, payload: Any, **kwargs: Any) -> Classification:
    result = classify(handler, payload, **kwargs)
    if not result.retryable:
        raise AssertionError(f"expected a retryable failure, got {result.kind} {result.error}")
    return result


def assert_permanent(handler: Handler | TaskHandler, payload: Any, **kwargs: Any) -> Classification:
    result = classify(handler, payload, **kwargs)
    if not result.permanent:
        raise AssertionError(f"expected a permanent failure, got {result.kind} {result.error}")
    return result


def raises(exc: BaseException) -> Callable[..., Any]:
    """A stand-in for a dependency that fails: ``monkeypatch.setattr(mod, "call", raises(E()))``."""

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fail
