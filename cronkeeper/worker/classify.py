"""Failure classes, decided in code (pure): what an attempt's ending means for the job.

- permanent, dead letter at once: ``cronkeeper.PermanentError`` (or any exception with a true
  ``cronkeeper_permanent`` attribute), an unknown task, a payload that does not fit the
  handler's shape, a command job this worker may not run or whose program cannot be run
  (missing, not executable), and exit codes 64-68 and 76-78 (sysexits: the input or
  configuration is wrong) or the schedule's ``permanent_exit_codes``;
- retryable: everything else, exit 75 (EX_TEMPFAIL) above all, timeouts, signals, crashes, a
  command that could not be started for a passing reason (its file being written, the worker
  out of processes, descriptors or memory),
  with exponential backoff and full jitter until ``max_attempts``, then dead letter
  (``cronkeeper.endings``: the policy the relay applies too).
"""

from __future__ import annotations

import errno
import signal

from cronkeeper.endings import Ending, Kind, Next, next_state
from cronkeeper.errors import PermanentError

__all__ = ["Ending", "Kind", "Next", "exception_ending", "exit_ending", "is_permanent", "next_state",
           "start_ending"]

PERMANENT_EXIT_CODES = frozenset(range(64, 69)) | frozenset(range(76, 79))
EX_TEMPFAIL = 75
# The reasons exec refuses a program that hold until the schedule or the host changes; any
# other reason (ETXTBSY while a deploy writes the file, EAGAIN, ENOMEM, EMFILE...) passes.
UNRUNNABLE = frozenset({errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOEXEC, errno.ENOTDIR,
                        errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG})


def is_permanent(exc: BaseException) -> bool:
    from cronkeeper.worker.registry import PayloadError, UnknownTask

    if isinstance(exc, PermanentError | UnknownTask | PayloadError):
        return True
    return bool(getattr(exc, "cronkeeper_permanent", False))


def exception_ending(exc: BaseException) -> Ending:
    text = f"{type(exc).__name__}: {exc}"
    return Ending(Kind.PERMANENT if is_permanent(exc) else Kind.RETRYABLE, text[:4000])


def exit_ending(code: int, permanent_codes: tuple[int, ...] = ()) -> Ending:
    """A command's exit status (negative: killed by that signal). What it printed is not part
    of the error: it is kept as the attempt's output, and its tail goes to ``last_error``."""
    if code == 0:
        return Ending(Kind.SUCCEEDED)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return Ending(Kind.RETRYABLE, f"killed by {name}")
    if code != EX_TEMPFAIL and (code in PERMANENT_EXIT_CODES or code in permanent_codes):
        return Ending(Kind.PERMANENT, f"exit status {code} (permanent)")
    return Ending(Kind.RETRYABLE, f"exit status {code}")


def start_ending(program: str, exc: OSError) -> Ending:
    """A command that could not be started: permanent when the program cannot be run as the
    schedule names it, retryable when the reason passes."""
    kind = Kind.PERMANENT if exc.errno in UNRUNNABLE else Kind.RETRYABLE
    return Ending(kind, f"cannot start {program!r}: {exc}")
