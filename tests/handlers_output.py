"""Handlers for tests/test_job_output.py (imported by the worker with --import handlers_output):
what they log and print is what those tests find in each attempt's output."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time

from cronkeeper.worker import task

log = logging.getLogger("tests.output")

# Two jobs take turns (thread isolation: one worker process, two runner threads), so that their
# records are emitted strictly alternately: the worst case for keeping them apart.
_turn = threading.Condition()
_state = {"turn": 0}
WAIT = 30.0


@task("output.alternate")
def alternate(payload, ctx):
    me, lines = int(payload["me"]), int(payload["lines"])
    for i in range(lines):
        with _turn:
            if not _turn.wait_for(lambda: _state["turn"] == me, WAIT):
                raise TimeoutError("the other job never took its turn")
            log.info("%s line %d", ctx.key, i)
            _state["turn"] = 1 - me
            _turn.notify_all()


_meeting = threading.Barrier(2)


@task("output.alternate_async")
async def alternate_async(payload, ctx):
    """Two async jobs at once: each logs from its coroutine, from a task it spawned and from a
    thread (asyncio.to_thread), all while the other does the same."""
    lines = int(payload["lines"])
    await asyncio.to_thread(_meeting.wait, WAIT)

    async def spawned() -> None:
        for i in range(lines):
            log.info("%s task %d", ctx.key, i)
            await asyncio.sleep(0)

    child = asyncio.create_task(spawned())
    for i in range(lines):
        log.info("%s main %d", ctx.key, i)
        await asyncio.to_thread(log.info, "%s thread %d", ctx.key, i)
        await asyncio.sleep(0)
    await child


@task("output.everything")
def everything(payload, ctx):
    """In process isolation: prints, stderr, raw fd writes, a record and a subprocess, in this
    order (each flushed by the line-buffered streams, or unbuffered)."""
    print("1 print to stdout")
    sys.stderr.write("2 write to stderr\n")
    os.write(1, b"3 raw write to fd 1\n")
    log.warning("4 a log record")
    subprocess.run(["/bin/sh", "-c", "echo 5 from a subprocess; echo 6 its stderr >&2"], check=True)
    print("7 print without newline", end="")
    if payload.get("fail"):
        raise RuntimeError("failing after printing")


@task("output.log_then_hang")
def log_then_hang(payload, ctx):
    log.info("%s before the hang", ctx.key)
    print(f"{ctx.key} printed before the hang", flush=True)
    time.sleep(float(payload.get("sleep", 60)))
    log.info("%s after the hang", ctx.key)


@task("output.log_then_hang_async")
async def log_then_hang_async(payload, ctx):
    log.info("%s before the hang", ctx.key)
    await asyncio.sleep(float(payload.get("sleep", 60)))
    log.info("%s after the hang", ctx.key)


@task("output.log_in_transaction")
def log_in_transaction(payload, ctx):
    """Uses the job's transaction, so the job commits with its completion (the handler
    process's own commit in process isolation): its output is written all the same."""
    log.info("%s in its transaction", ctx.key)
    print(f"{ctx.key} printed", flush=True)
    with ctx.effect(f"output:{ctx.key}") as first:
        assert first
    time.sleep(float(payload.get("sleep", 0)))


@task("output.log_lines")
def log_lines(payload, ctx):
    for i in range(int(payload.get("lines", 10))):
        log.info("%s line %d", ctx.key, i)
    if payload.get("fail"):
        raise RuntimeError(payload["fail"])


@task("output.silent_then_log")
def silent_then_log(payload, ctx):
    """Silent for ``sleep`` seconds (its capture not made yet), then one record if ``log``;
    fails with ``fail``."""
    time.sleep(float(payload.get("sleep", 0)))
    if payload.get("log"):
        log.info("%s after a silent start", ctx.key)
    if payload.get("fail"):
        raise RuntimeError(payload["fail"])


@task("output.silent_then_log_async")
async def silent_then_log_async(payload, ctx):
    await asyncio.sleep(float(payload.get("sleep", 0)))
    if payload.get("log"):
        await asyncio.to_thread(log.info, "%s after a silent start", ctx.key)


@task("output.report_level")
def report_level(payload, ctx):
    """Logs one INFO line, then fails on purpose with whether an INFO record is made here at
    all (a worker that keeps no output leaves the root logger at WARNING)."""
    log.info("%s info line", ctx.key)
    raise RuntimeError(f"info records made: {log.isEnabledFor(logging.INFO)}")
