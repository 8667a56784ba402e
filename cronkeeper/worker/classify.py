"""Failure classes, decided in code (pure): what an attempt's ending means for the job.

- permanent, dead letter at once: ``cronkeeper.PermanentError`` (or any exception with a true
  ``cronkeeper_permanent`` attribute), an unknown task, a payload that does not fit the
  handler's shape, a command job this worker may not run, and exit codes 64-68 and 76-78
  (sysexits: the input or configuration is wrong) or the schedule's ``permanent_exit_codes``;
- retryable: everything else, exit 75 (EX_TEMPFAIL) above all, timeouts, signals, crashes,
  with exponential backoff and full jitter until ``max_attempts``, then dead letter.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import StrEnum

from cronkeeper.backoff import retry_delay
from cronkeeper.errors import PermanentError

PERMANENT_EXIT_CODES = frozenset(range(64, 69)) | frozenset(range(76, 79))
EX_TEMPFAIL = 75


class Kind(StrEnum):
    """How one attempt ended (before the attempt cap is applied)."""

    SUCCEEDED = "succeeded"
    RETRYABLE = "retryable"
    PERMANENT = "permanent"
    TIMEOUT = "timeout"


@dataclass(frozen=True, slots=True)
class Ending:
    kind: Kind
    error: str = ""


@dataclass(frozen=True, slots=True)
class Next:
    """The job's next state and the attempt's recorded outcome (spelled as stored)."""

    state: str  # succeeded | available | dead
    outcome: str  # attempts.outcome: succeeded | retry | timeout | dead
    delay: float = 0.0
    error: str = ""


def is_permanent(exc: BaseException) -> bool:
    from cronkeeper.worker.registry import PayloadError, UnknownTask

    if isinstance(exc, PermanentError | UnknownTask | PayloadError):
        return True
    return bool(getattr(exc, "cronkeeper_permanent", False))


def exception_ending(exc: BaseException) -> Ending:
    text = f"{type(exc).__name__}: {exc}"
    return Ending(Kind.PERMANENT if is_permanent(exc) else Kind.RETRYABLE, text[:4000])


def exit_ending(code: int, permanent_codes: tuple[int, ...] = (), stderr_tail: str = "") -> Ending:
    """A command's exit status (negative: killed by that signal)."""
    tail = f": {stderr_tail.strip()}" if stderr_tail.strip() else ""
    if code == 0:
        return Ending(Kind.SUCCEEDED)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return Ending(Kind.RETRYABLE, f"killed by {name}{tail}"[:4000])
    if code != EX_TEMPFAIL and (code in PERMANENT_EXIT_CODES or code in permanent_codes):
        return Ending(Kind.PERMANENT, f"exit status {code} (permanent){tail}"[:4000])
    return Ending(Kind.RETRYABLE, f"exit status {code}{tail}"[:4000])


def next_state(
    ending: Ending, attempt: int, max_attempts: int, backoff: dict[str, float], rand: float
) -> Next:
    """Apply the attempt cap and the job's backoff (full jitter, ``rand`` in [0, 1))."""
    if ending.kind is Kind.SUCCEEDED:
        return Next("succeeded", "succeeded")
    if ending.kind is Kind.PERMANENT:
        return Next("dead", "dead", 0.0, ending.error)
    timed_out = ending.kind is Kind.TIMEOUT
    if attempt >= max_attempts:
        error = f"{ending.error} (attempt {attempt} of {max_attempts}: giving up)"
        return Next("dead", "timeout" if timed_out else "dead", 0.0, error)
    outcome = "timeout" if timed_out else "retry"
    delay = retry_delay(
        attempt,
        float(backoff.get("base", 30.0)),
        float(backoff.get("factor", 2.0)),
        float(backoff.get("max", 3600.0)),
        rand,
    )
    return Next("available", outcome, delay, ending.error)
