"""Command jobs: the argv comes from the worker's OWN schedule files, never from the outbox row.

``decide`` (pure) compares the job's schedule version with the worker's spec of that schedule:
- same digest: run the worker's argv;
- different digest, and the job's version is the newest in schedule_versions: WAIT (this worker's
  files are behind; the job is handed back without counting an attempt);
- different digest and the job's version superseded, the schedule unknown to this worker, a
  version that does not exist, or a task schedule: REFUSE (permanent, dead letter at once).

``run`` starts the child in a new session (its own process group), reads its stdout and stderr
(one pipe) into the attempt's capture, or sends both to /dev/null, and waits on the child's
pidfd. Past the timeout, or when the wait itself fails, it kills the whole group: SIGTERM, then
SIGKILL after ``kill_grace`` seconds (what it printed until then is kept).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from cronkeeper import clock
from cronkeeper.errors import UsageError
from cronkeeper.output import Capture
from cronkeeper.schedule.model import ScheduleSpec


class Verdict(StrEnum):
    RUN = "run"
    WAIT = "wait"
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class CommandDecision:
    verdict: Verdict
    reason: str = ""
    spec: ScheduleSpec | None = None


def decide(
    schedule: str | None,
    version_id: int | None,
    version: tuple[str, bool] | None,
    spec: ScheduleSpec | None,
) -> CommandDecision:
    """``version``: (digest, newest) of the job's schedule version, None when absent."""
    if schedule is None or version_id is None:
        return CommandDecision(Verdict.REFUSE, "command job without a schedule version: commands run "
                        "only from the worker's own schedule files")
    if version is None:
        return CommandDecision(Verdict.REFUSE, f"schedule version {version_id} of {schedule!r} does not "
                        "exist in schedule_versions")
    digest, newest = version
    if spec is None:
        return CommandDecision(Verdict.REFUSE, f"schedule {schedule!r} is unknown to this worker (job "
                        f"version {digest[:12]}): not in its --schedules files")
    if spec.command is None:
        return CommandDecision(Verdict.REFUSE, f"schedule {schedule!r} is a task schedule in this "
                        "worker's files, not a command")
    if spec.digest == digest:
        return CommandDecision(Verdict.RUN, spec=spec)
    if newest:
        return CommandDecision(Verdict.WAIT, f"job needs version {digest[:12]} of {schedule!r}, the "
                        f"newest; this worker has {spec.digest[:12]}: waiting for its schedule "
                        "files to be updated")
    return CommandDecision(Verdict.REFUSE, f"job's version {digest[:12]} of {schedule!r} has been "
                    f"superseded; this worker has version {spec.digest[:12]}")


def load_specs(directory: str | None) -> tuple[dict[str, ScheduleSpec], str]:
    """The worker's schedules by name, and their set digest ('' without --schedules)."""
    if not directory:
        return {}, ""
    try:
        from cronkeeper.schedule import load_valid
    except ImportError:
        raise UsageError("this build cannot load schedule files (cronkeeper.schedule.load_valid "
                         "is missing)") from None
    schedule_set = load_valid([directory], now=clock.wall())
    return schedule_set.by_name(), schedule_set.digest


def job_env(schedule: str | None, scheduled_for: datetime | None, key: str, attempt: int,
            payload_json: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "CRONKEEPER_SCHEDULE": schedule or "",
        "CRONKEEPER_SCHEDULED_FOR": format_instant(scheduled_for),
        "CRONKEEPER_IDEMPOTENCY_KEY": key,
        "CRONKEEPER_ATTEMPT": str(attempt),
        "CRONKEEPER_PAYLOAD": payload_json,
    })
    return env


def format_instant(at: datetime | None) -> str:
    if at is None:
        return ""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# The longest one poll waits, in seconds: poll takes at most 2**31 - 1 ms (24.8 days) and a
# schedule's timeout may be years; past it the loop looks at the deadline and polls again.
LONGEST_POLL = 3600.0


@dataclass(frozen=True, slots=True)
class Exit:
    code: int | None  # None: timed out (the group was killed)


def run(
    argv: tuple[str, ...],
    env: dict[str, str],
    timeout: float,
    *,
    on_start: Callable[[subprocess.Popen], None] = lambda p: None,
    kill_grace: float = 2.0,
    capture: Capture | None = None,
) -> Exit:
    """Run argv (never a shell); past ``timeout`` kill its whole process group.

    Its stdout and stderr are one pipe, read into ``capture`` by this thread while it waits:
    both streams are the same pipe, so the kernel keeps the order in which the writes arrived
    (two pipes and a reader cannot tell which of two writes came first). Without a capture
    (``output_limit`` 0) both go to /dev/null."""
    deadline = clock.monotonic() + max(timeout, 0.001)
    if capture is None:
        proc = subprocess.Popen(  # noqa: S603 - argv from the worker's own schedule files
            list(argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )
        with _killed_on_error(proc, kill_grace):
            on_start(proc)
            code = _wait_until_exit(proc, deadline)
        if code is None:
            kill_group(proc, kill_grace)
        return Exit(code)
    read_fd, write_fd = os.pipe()
    try:
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv from the worker's own schedule files
                list(argv), env=env, stdin=subprocess.DEVNULL, stdout=write_fd,
                stderr=write_fd, start_new_session=True,
            )
        finally:
            os.close(write_fd)
        with _killed_on_error(proc, kill_grace):
            on_start(proc)
            code = _read_until_exit(proc, read_fd, capture, deadline)
        if code is None:
            kill_group(proc, kill_grace)
            _drain(read_fd, capture)  # what it printed until the kill
        return Exit(code)
    finally:
        os.close(read_fd)


@contextlib.contextmanager
def _killed_on_error(proc: subprocess.Popen, grace: float) -> Iterator[None]:
    """Kill the child's group if waiting for it fails (``on_start`` raising, an interrupt): a
    job whose attempt ends in an error must not leave its command running, unreaped, to be
    started again by the retry."""
    try:
        yield
    except BaseException:
        kill_group(proc, grace)
        raise


def _read_until_exit(proc: subprocess.Popen, fd: int, capture: Capture, deadline: float) -> int | None:
    """Read the pipe into ``capture`` until the child exits (its exit status) or the deadline
    passes (None). Once the child has exited, what is in the pipe is read and the rest left: a
    process it left running in the background may hold the pipe open for ever. Reads only what
    poll says is there (no non-blocking reads ending in an exception): at 1 KiB a job that is
    two polls and two reads."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    pidfd = _pidfd(proc.pid)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    try:
        open_pipe, exited = True, False
        while True:
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return None
            # Without a pidfd (an old kernel) the exit is noticed by looking every 50 ms.
            wait = min(remaining, LONGEST_POLL) if pidfd is not None else min(remaining, 0.05)
            for ready, events in poller.poll(max(1, math.ceil(wait * 1000))):
                if ready == pidfd:
                    exited = True
                elif events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    data = os.read(fd, 65536)
                    if data:
                        capture.feed(data)
                    else:  # every writer closed it
                        poller.unregister(fd)
                        open_pipe = False
            if exited or pidfd is None or not open_pipe:
                code = proc.poll()
                if code is not None:
                    if open_pipe:
                        _drain(fd, capture)
                    return code
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _wait_until_exit(proc: subprocess.Popen, deadline: float) -> int | None:
    """The child's exit status, or None once the deadline passes, woken by its pidfd when it
    exits, as ``_read_until_exit`` is: ``Popen.wait`` with a timeout looks by sleeping (0.5 ms,
    then twice as long each time up to 50 ms), which noticed a job that ran 1 ms about 0.2 ms
    late on average and a long one up to 50 ms late."""
    pidfd = _pidfd(proc.pid)
    if pidfd is None:  # an old kernel
        try:
            return proc.wait(timeout=max(deadline - clock.monotonic(), 0.001))
        except subprocess.TimeoutExpired:
            return None
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while (code := proc.poll()) is None:
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return None
            poller.poll(max(1, math.ceil(min(remaining, LONGEST_POLL) * 1000)))
        return code
    finally:
        os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when the process exits (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _drain(fd: int, capture: Capture) -> None:
    """Read what the pipe holds now (its writer gone, or killed) into ``capture``."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while poller.poll(0):
        try:
            data = os.read(fd, 65536)
        except OSError:
            return
        if not data:
            return
        capture.feed(data)


def kill_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``grace`` seconds."""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = clock.monotonic() + grace
    while proc.poll() is None and clock.monotonic() < deadline:
        clock.sleep(0.02)
    # The group may outlive its leader (grandchildren): kill it whatever the leader did.
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
