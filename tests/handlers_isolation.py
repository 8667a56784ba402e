"""Handlers for the isolation tests (process-isolated and async), imported by worker processes
with ``--import handlers_isolation``. Pids and markers go to files under the payload's ``dir``
(a handler's own transaction is rolled back when it is killed, so it cannot be the witness)."""

from __future__ import annotations

import asyncio
import ctypes
import os
import subprocess
from pathlib import Path

from cronkeeper.errors import PermanentError
from cronkeeper.worker import task


def _note(payload: dict, name: str, text: str) -> None:
    path = Path(payload["dir"]) / name
    with open(path, "a") as f:
        f.write(text + "\n")


@task("iso.stuck")
def stuck(payload, ctx):
    """Claims an effect and enqueues a follow-up in the job's transaction, starts a grandchild,
    then blocks where no Python code runs (libc pause(), or a query in the server), on the
    attempts listed in ``stuck_attempts``; other attempts just complete."""
    with ctx.effect(f"stuck:{ctx.key}") as first:
        if first:
            ctx.connection.exec_driver_sql(
                "INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)", {"k": ctx.key, "p": os.getpid()})
    ctx.enqueue("noop", {}, key=f"followup:{ctx.key}")
    if ctx.attempt not in payload.get("stuck_attempts", [1]):
        return
    grandchild = subprocess.Popen(["sleep", "1000"])  # noqa: S603, S607
    backend = ctx.connection.exec_driver_sql("SELECT pg_backend_pid()").scalar()
    _note(payload, "pids", f"{os.getpid()} {grandchild.pid} {backend}")
    if payload.get("how") == "query":
        ctx.connection.exec_driver_sql("SELECT pg_sleep(1000)")
    else:
        ctypes.CDLL(None).pause()


@task("iso.crash")
def crash(payload, ctx):
    """Crashes on attempt 1 the way ``how`` says; later attempts succeed."""
    if ctx.attempt > 1:
        _note(payload, "done", f"{ctx.attempt}")
        return
    _note(payload, "pids", f"{os.getpid()}")
    how = payload["how"]
    if how == "segv":
        ctypes.string_at(0)
    elif how == "exit3":
        os._exit(3)
    elif how == "wait_for_kill":
        ctypes.CDLL(None).pause()
    raise AssertionError(f"unknown crash {how!r}")


@task("iso.commit_then_die")
def commit_then_die(payload, ctx):
    """Commits (with the completion) and dies before telling the worker: the child's reply
    function is replaced by an exit."""
    from cronkeeper.worker import child

    with ctx.effect(f"once:{ctx.key}") as first:
        if first:
            ctx.connection.exec_driver_sql(
                "INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)", {"k": ctx.key, "p": os.getpid()})
    child._reply = lambda out, reply: os._exit(0)


@task("iso.pid")
def pid(payload, ctx):
    """Records which process ran the job (in the job's transaction)."""
    ctx.connection.exec_driver_sql(
        "INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)", {"k": ctx.key, "p": os.getpid()})
    if payload.get("hold_mib"):
        _HOARD.append(bytearray(int(payload["hold_mib"]) * 1024 * 1024))


_HOARD: list[bytearray] = []


@task("iso.forced_process", isolation="process")
def forced_process(payload, ctx):
    import time

    time.sleep(float(payload.get("sleep", 0)))
    ctx.connection.exec_driver_sql(
        "INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)", {"k": ctx.key, "p": os.getpid()})


# -- async ----------------------------------------------------------------------------------------

class FlakyAsync(Exception):
    pass


@task("iso.async_ok")
async def async_ok(payload, ctx):
    """The effect helper and a follow-up job, on the async connection."""
    await asyncio.sleep(0)
    async with ctx.effect(f"async:{ctx.key}") as first:
        if first:
            conn = await ctx.connection()
            await conn.execute("INSERT INTO runs (key, pid) VALUES (%(k)s, %(p)s)",
                               {"k": ctx.key, "p": os.getpid()})
    if payload.get("follow"):
        await ctx.enqueue("noop", {}, key=f"followup:{ctx.key}")


@task("iso.async_backend")
async def async_backend(payload, ctx):
    """Records which database session ran the job's transaction."""
    conn = await ctx.connection()
    await conn.execute("INSERT INTO runs (key, pid) VALUES (%(k)s, pg_backend_pid())", {"k": ctx.key})


@task("iso.async_fails")
async def async_fails(payload, ctx):
    await asyncio.sleep(0)
    raise FlakyAsync("upstream 503")


@task("iso.async_permanent")
async def async_permanent(payload, ctx):
    await asyncio.sleep(0)
    raise PermanentError("order 7 does not exist")


@task("iso.async_hangs")
async def async_hangs(payload, ctx):
    """Hangs on attempt 1 with a task of its own ticking into a file; later attempts succeed.
    Both are cancelled at the timeout: their ``finally`` notes it."""
    if ctx.attempt > 1:
        return
    await ctx.enqueue("noop", {}, key=f"followup:{ctx.key}")

    async def ticker():
        try:
            while True:
                _note(payload, "ticks", "tick")
                await asyncio.sleep(0.02)
        finally:
            _note(payload, "cancelled", "ticker")

    leftover = asyncio.get_running_loop().create_task(ticker())  # left behind on purpose
    try:
        await asyncio.Event().wait()
    finally:
        _note(payload, "cancelled", "handler")
        del leftover


@task("iso.overstay")
def overstay(payload, ctx):
    """A sync handler on a thread that outlives its timeout, then notes that it returned."""
    import time

    time.sleep(float(payload["sleep"]))
    _note(payload, "woke", "yes")
