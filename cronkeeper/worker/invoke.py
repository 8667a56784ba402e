"""Calling a handler and ending its job's transaction: shared by the worker's runner threads
(``async def`` handlers), the pooled child processes (every handler) and ``cronkeeper.testing``.

Coroutine handlers run on an event loop *per runner thread* (one per child process), not on one
loop shared by the worker. A job occupies a runner either way (``--concurrency`` counts jobs),
so a shared loop would buy no concurrency; a loop per runner means the thread that waits for the
handler also enforces its timeout with ``Task.cancel()``, a handler that blocks its loop with a
sync call stalls only its own runner (the supervisor then abandons that thread as it does a hung
sync handler), and a handler that refuses to be cancelled simply stops running: a loop only
makes progress while its thread drives it, and the thread stops driving it after ``grace``
seconds and starts a fresh loop. Tasks a handler spawned and left behind are cancelled when it
ends, so nothing of a job runs after its attempt is recorded (threads it started with
``asyncio.to_thread`` excepted: use ``--isolation process`` for those).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cronkeeper.worker.classify import Ending, Kind, exception_ending

_local = threading.local()


class Done(StrEnum):
    """How a handler's call ended, as its runner must act on it."""

    SUCCEEDED = "succeeded"  # returned, no transaction: the recorder completes the job
    COMMITTED = "committed"  # returned; its transaction committed with the fenced completion
    LOST = "lost"  # returned; the fence refused the completion (lease lost), rolled back
    FAILED = "failed"  # raised, timed out, or its commit failed: ``ending`` says which
    DROPPED = "dropped"  # returned, but someone else had already settled the job


@dataclass(frozen=True, slots=True)
class Result:
    done: Done
    ending: Ending | None = None
    settled: bool = False  # FAILED after ``before_commit`` settled the job


def thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop (a new one after a handler refused cancellation)."""
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop


def run_on_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    return thread_loop().run_until_complete(coro)


@dataclass(frozen=True, slots=True)
class CoroutineResult:
    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    stuck: bool = False  # ignored its cancellation for ``grace`` seconds; its loop was dropped


def run_coroutine(coro: Coroutine[Any, Any, Any], timeout: float | None, grace: float) -> CoroutineResult:
    """Run ``coro`` on this thread's loop; past ``timeout`` cancel it (and wait ``grace``)."""
    loop = thread_loop()
    task = loop.create_task(coro)
    timed_out = stuck = False
    try:
        loop.run_until_complete(asyncio.wait({task}, timeout=timeout))
        if not task.done():
            timed_out = True
            task.cancel()
            loop.run_until_complete(asyncio.wait({task}, timeout=max(grace, 0.01)))
            stuck = not task.done()
    finally:
        stuck = not _cancel_leftovers(loop, task, grace) or stuck
        if stuck:
            _local.loop = None  # never driven again: nothing on it runs any more
    if timed_out or stuck:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" noise
        return CoroutineResult(timed_out=True, stuck=stuck)
    if task.cancelled():
        return CoroutineResult(error=asyncio.CancelledError("the handler's task was cancelled"))
    error = task.exception()
    return CoroutineResult(error=error) if error is not None else CoroutineResult(value=task.result())


def _cancel_leftovers(loop: asyncio.AbstractEventLoop, main: asyncio.Task, grace: float) -> bool:
    """Cancel the tasks the handler left on the loop; False when some outlived ``grace``."""
    rest = [t for t in asyncio.all_tasks(loop) if t is not main and not t.done()]
    if not rest:
        return True
    for t in rest:
        t.cancel()
    loop.run_until_complete(asyncio.wait(rest, timeout=max(grace, 0.01)))
    return all(t.done() for t in rest)


def call_sync(func: Callable[[Any, Any], Any], payload: Any, ctx: Any, worker_id: str) -> Result:
    """A sync handler in a process of its own (a child): call, then end the transaction."""
    try:
        func(payload, ctx)
    except BaseException as exc:  # noqa: BLE001 - SystemExit too: a handler's failure
        ctx.finish(commit=False)
        return Result(Done.FAILED, exception_ending(exc))
    if not ctx.in_transaction:
        return Result(Done.SUCCEEDED)
    try:
        return Result(Done.COMMITTED if ctx.complete(worker_id) else Done.LOST)
    except Exception as exc:  # noqa: BLE001 - the commit failed: the attempt failed
        ctx.finish(commit=False)
        return Result(Done.FAILED, Ending(Kind.RETRYABLE, f"committing the job's transaction "
                                          f"failed: {exc}"))


def call_async(
    func: Callable[[Any, Any], Any], payload: Any, ctx: Any, worker_id: str, *,
    timeout: float | None, grace: float, before_commit: Callable[[], bool] = lambda: True,
    output: Callable[[], bytes | None] = lambda: None, keep_output: bool = False,
) -> Result:
    """An ``async def`` handler on this thread's loop, cancelled past ``timeout``; its
    transaction commits with the completion once ``before_commit()`` (the runner settling the
    job) says the attempt is still ours, with the attempt's ``output()`` when ``keep_output``
    (the schema keeps it)."""
    outcome = run_coroutine(func(payload, ctx), timeout, grace)
    if outcome.stuck:
        ctx.drop()
        return Result(Done.FAILED, Ending(Kind.TIMEOUT, f"timed out after {timeout:g}s: coroutine "
                                          f"cancelled; it ignored the cancellation for {grace:g}s "
                                          "and was stopped (its loop is never run again)"))
    if outcome.timed_out or outcome.error is not None:
        _quietly(ctx.finish(commit=False), ctx)
        if outcome.timed_out:
            return Result(Done.FAILED, Ending(Kind.TIMEOUT, f"timed out after {timeout:g}s: "
                                              "coroutine cancelled"))
        assert outcome.error is not None
        return Result(Done.FAILED, exception_ending(outcome.error))
    if not ctx.in_transaction:
        return Result(Done.SUCCEEDED)
    if not before_commit():
        _quietly(ctx.finish(commit=False), ctx)
        return Result(Done.DROPPED)
    try:
        committed = run_on_loop(ctx.complete(worker_id, output=output(), keep_output=keep_output))
        return Result(Done.COMMITTED if committed else Done.LOST)
    except Exception as exc:  # noqa: BLE001 - the commit failed: the attempt failed
        _quietly(ctx.finish(commit=False), ctx)
        return Result(Done.FAILED, Ending(Kind.RETRYABLE, f"committing the job's transaction "
                                          f"failed: {exc}"), settled=True)


def _quietly(coro: Coroutine[Any, Any, Any], ctx: Any) -> None:
    """Roll back; a connection that cannot even do that is dropped (the server rolls back)."""
    try:
        run_on_loop(coro)
    except Exception:  # noqa: BLE001
        ctx.drop()
