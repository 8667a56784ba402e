"""The coroutine runner behind async handlers, without a database: a coroutine past its
timeout is cancelled with the tasks it left behind, and one that refuses to be cancelled is
never run again (its loop is not driven any more)."""

from __future__ import annotations

import asyncio

from cronkeeper.worker.invoke import run_coroutine, thread_loop


def test_a_coroutine_that_returns_or_raises_is_reported_as_such():
    async def value():
        return 42

    async def boom():
        raise ValueError("no")

    assert run_coroutine(value(), timeout=5, grace=1).value == 42
    outcome = run_coroutine(boom(), timeout=5, grace=1)
    assert isinstance(outcome.error, ValueError) and not outcome.timed_out


def test_past_its_timeout_a_coroutine_and_its_leftover_tasks_are_cancelled():
    seen: list[str] = []

    async def leftover():
        try:
            await asyncio.Event().wait()
        finally:
            seen.append("leftover cancelled")

    async def hangs():
        asyncio.get_running_loop().create_task(leftover())
        try:
            await asyncio.Event().wait()
        finally:
            seen.append("handler cancelled")

    outcome = run_coroutine(hangs(), timeout=0.05, grace=1)
    assert outcome.timed_out and not outcome.stuck
    assert sorted(seen) == ["handler cancelled", "leftover cancelled"]
    assert [t for t in asyncio.all_tasks(thread_loop()) if not t.done()] == []


def test_a_coroutine_that_ignores_cancellation_never_runs_again():
    ticks: list[int] = []

    async def stubborn():
        while True:
            try:
                ticks.append(1)
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                continue  # refuses to stop

    before = thread_loop()
    outcome = run_coroutine(stubborn(), timeout=0.05, grace=0.05)
    assert outcome.timed_out and outcome.stuck
    assert thread_loop() is not before  # the next job gets a fresh loop
    count = len(ticks)

    async def later():
        await asyncio.sleep(0.1)  # time in which the stubborn one would tick ten times
        return "ok"

    assert run_coroutine(later(), timeout=5, grace=1).value == "ok"
    assert len(ticks) == count
