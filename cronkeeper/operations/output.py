"""What a job printed, as an operator asks for it: one attempt's output by the job's key
(``cronkeeper output``, the web's ``/api/output``), each attempt's size and last lines (``explain``,
``dlq show``), and the tail of a job's last attempt (``last_output_tail``: what a dead letter's
``last_error`` keeps, and what a notification about it can quote)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cronkeeper import output as printed
from cronkeeper.db.attempts import attempts_last_output, attempts_output_by_key
from cronkeeper.db.engine import Connection, Engine, translate_errors
from cronkeeper.errors import CronkeeperError


class OutputNotFound(CronkeeperError):
    """No job with that key, or no such attempt of it (exit 1)."""


@dataclass(frozen=True, slots=True)
class AttemptOutput:
    key: str
    attempt: int
    outcome: str | None  # None: still running
    output: bytes | None  # as captured; None: nothing kept (output_limit 0, an older worker...)

    @property
    def note(self) -> str | None:
        """Why there is nothing to show, when there is nothing."""
        if self.output is not None:
            return None
        if self.outcome is None:
            return f"attempt {self.attempt} is still running: its output is kept when it ends"
        return (f"attempt {self.attempt} ({self.outcome}) kept no output (output_limit 0, a "
                "worker of an earlier release, or an attempt that ended without its worker)")


def attempt_output(engine: Engine, key: str, attempt: int | None = None) -> AttemptOutput:
    """The output of attempt ``attempt`` of the job with idempotency key ``key``, or of its
    newest attempt (the latest started: earlier ones keep their numbers, negative after a dlq
    replay). OutputNotFound when there is no such job or attempt."""
    with translate_errors("reading a job's output"), engine.connect() as conn:
        row = attempts_output_by_key(conn, key, attempt)
    if row is None:
        raise OutputNotFound(f"no job with key {key!r} (pruned after retention, never "
                             "emitted, or a typo: a period's key is NAME@INSTANT in UTC, "
                             "e.g. backup@2026-03-08T07:00:00Z, each period's scheduled_for in "
                             "`cronkeeper history NAME --format json`; `cronkeeper dlq list` "
                             "shows dead jobs' keys)")
    if row["attempt"] is None:
        if attempt is None:
            raise OutputNotFound(f"job {key!r} has no attempt yet")
        raise OutputNotFound(f"job {key!r} has no attempt {attempt} (`cronkeeper explain "
                             f"{key}` lists its attempts)")
    output = row["output"]
    return AttemptOutput(key, int(row["attempt"]), row["outcome"],
                         None if output is None else bytes(output))


def last_output_tail(conn: Connection, job_id: int, lines: int = printed.TAIL_LINES) -> str:
    """The last ``lines`` lines its newest attempt printed, as text (invalid UTF-8 replaced;
    escape it for where it goes); '' when it printed nothing or nothing was kept."""
    return printed.tail_text(attempts_last_output(conn, job_id), lines)


def attempt_view(row: dict[str, Any]) -> dict[str, Any]:
    """An attempt row of ``attempts_for_job`` for JSON and pages: ``output_bytes`` (None: nothing
    kept) and ``output_last_lines`` (its last 10 lines, escaped) instead of the raw end."""
    view = dict(row)
    end = view.pop("output_end", None)
    view["output_last_lines"] = printed.last_lines(bytes(end)) if end else []
    return view
