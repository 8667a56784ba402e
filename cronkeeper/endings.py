"""What an attempt's ending means for its job (pure): the one policy ``cronkeeper worker`` and
``cronkeeper relay`` both apply. A permanent failure is a dead letter at once; any other failure
retries with exponential backoff and full jitter (``backoff.job_retry_delay``) until the job's
``max_attempts``, then it is a dead letter too. How a handler's exception or a command's exit
status becomes an ``Ending`` is the worker's (``worker.classify``); how a failed publish does,
the relay's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from cronkeeper.backoff import job_retry_delay
from cronkeeper.states import AttemptOutcome, JobState


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
    """The job's next state and the attempt's recorded outcome."""

    state: JobState  # succeeded | available | dead
    outcome: AttemptOutcome  # succeeded | retry | timeout | dead
    delay: float = 0.0
    error: str = ""


def next_state(
    ending: Ending, attempt: int, max_attempts: int, backoff: Mapping[str, float], rand: float
) -> Next:
    """Apply the attempt cap and the job's backoff (full jitter, ``rand`` in [0, 1))."""
    if ending.kind is Kind.SUCCEEDED:
        return Next(JobState.SUCCEEDED, AttemptOutcome.SUCCEEDED)
    if ending.kind is Kind.PERMANENT:
        return Next(JobState.DEAD, AttemptOutcome.DEAD, 0.0, ending.error)
    timed_out = ending.kind is Kind.TIMEOUT
    if attempt >= max_attempts:
        error = f"{ending.error} (attempt {attempt} of {max_attempts}: giving up)"
        return Next(JobState.DEAD, AttemptOutcome.TIMEOUT if timed_out else AttemptOutcome.DEAD,
                    0.0, error)
    outcome = AttemptOutcome.TIMEOUT if timed_out else AttemptOutcome.RETRY
    return Next(JobState.AVAILABLE, outcome, job_retry_delay(attempt, backoff, rand), ending.error)
