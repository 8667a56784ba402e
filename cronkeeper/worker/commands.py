"""Command jobs: the argv comes from the worker's OWN schedule files, never from the outbox row.

``decide`` (pure) compares the job's schedule version with the worker's spec of that schedule:
- same digest: run the worker's argv;
- different digest, and the job's version is the newest in schedule_versions: WAIT (this worker's
  files are behind; the job is handed back without counting an attempt);
- different digest and the job's version superseded, the schedule unknown to this worker, a
  version that does not exist, or a task schedule: REFUSE (permanent, dead letter at once).

``run`` starts the child in a new session (its own process group) and, past the timeout, kills
the whole group: SIGTERM, then SIGKILL after ``kill_grace`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from cronkeeper import clock
from cronkeeper.errors import UsageError
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


@dataclass(frozen=True, slots=True)
class Exit:
    code: int | None  # None: timed out (the group was killed)
    stderr_tail: str


def run(
    argv: tuple[str, ...],
    env: dict[str, str],
    timeout: float,
    *,
    on_start: Callable[[subprocess.Popen], None] = lambda p: None,
    kill_grace: float = 2.0,
) -> Exit:
    """Run argv (never a shell); past ``timeout`` kill its whole process group."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(  # noqa: S603 - argv from the worker's own schedule files
            list(argv), env=env, stdin=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
        on_start(proc)
        try:
            code: int | None = proc.wait(timeout=max(timeout, 0.001))
        except subprocess.TimeoutExpired:
            kill_group(proc, kill_grace)
            code = None
        err.seek(0, os.SEEK_END)
        size = err.tell()
        err.seek(max(0, size - 2000))
        tail = err.read().decode(errors="replace")
    return Exit(code, tail)


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
