"""A handler's ``logging`` records, kept with its attempt's output.

Thread isolation: one handler on the root logger (``install``) hands each record to the capture
of the job whose code emitted it, found in a context variable that the runner thread sets
around the handler (``capturing``). A context variable, not the thread's identity: an ``async
def`` handler's tasks, and what it runs with ``asyncio.to_thread``, copy the context they were
created in, so they are found too; two jobs running side by side on two runner threads each
see only their own. A thread the handler starts itself (``threading.Thread``) starts with an
empty context: its records are not kept (as a thread pool's, unless it copies the context).

Process isolation: the handler process writes its records to its stderr (``child_setup``),
which is the pipe the worker reads the attempt's output from, so they arrive in order with
what the handler prints.

Which records: those that reach the root logger. An application that set the root logger's
level keeps it; one left at the default (WARNING) is lowered to INFO, so that a handler's
``log.info`` lines are kept, and handlers already on the root logger keep the level they
printed at. Records outside any job are handled as before: a WARNING or worse with no other
handler in its way goes to ``logging.lastResort`` (stderr), as it did without this one.

When: the worker installs it as it starts if it may keep a handler's records (its
``--output-limit`` or one of its task schedules' limits is not 0), else before the first job
that keeps them (``install`` is idempotent and cheap once done). A worker that keeps
no output at all never lowers the root logger, so a discarded ``log.info`` record is never
made, as before output was kept. A handler process is told the level with each job
(``lower_to``), so one started before the install keeps records from then on.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cronkeeper.worker.runtime import WorkerConfig


class Lines(Protocol):
    """Where a job's records go: the ``Running`` job (``runtime``), which keeps them as lines
    and makes its ``Capture`` (fed bytes) only when they pass ``spill_at``. ``JobLogCapture``
    appends each record's line to ``lines`` and counts it in ``pending`` itself, calling
    ``spill`` once past ``spill_at``: the two calls per record into the sink it made before,
    ``getMessage``'s frame and a ``Capture`` made for every job that logged were a quarter of
    what keeping the records cost (instructions counted by callgrind:
    benchmarks/log_capture_cost.py --instructions)."""

    lines: list[str]
    pending: int
    spill_at: int

    def spill(self) -> None: ...


_current: contextvars.ContextVar[Lines | None] = contextvars.ContextVar(
    "cronkeeper_job_output", default=None)

_LogRecord = logging.LogRecord
_MILLIS = [f".{ms:03d}Z" for ms in range(1000)]
_second: tuple[int, str] = (-1, "")  # the last second seen, formatted (up to the ".")
# The last millisecond seen: [start, end) as instants, and its stamp. One tuple, replaced whole,
# so that a thread reading it while another replaces it sees one millisecond's three values.
_milli: tuple[float, float, str] = (0.0, 0.0, "")


def _stamp(created: float) -> str:
    """``2026-03-08T07:00:01.250Z`` for an instant, kept for the records of the same
    millisecond (one ``strftime`` per second, one concatenation per millisecond)."""
    global _second, _milli
    ms = int(created * 1000)
    second, millis = divmod(ms, 1000)
    cached = _second
    if cached[0] != second:
        cached = _second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
    stamp = cached[1] + _MILLIS[millis]
    _milli = (ms / 1000, (ms + 1) / 1000, stamp)
    return stamp


def line(record: logging.LogRecord) -> str:
    """``2026-03-08T07:00:01.250Z INFO myapp.billing: message``, then the traceback if any.

    Made for every record a job emits, so it is kept lean (measured in
    benchmarks/output_capture.py): a record of the millisecond before costs two float
    comparisons for its stamp, not a division, a rounding and a concatenation."""
    created = record.created
    milli = _milli
    stamp = milli[2] if milli[0] <= created < milli[1] else _stamp(created)
    text = f"{stamp} {record.levelname} {record.name}: {record.getMessage()}\n"
    if record.exc_info or record.exc_text or record.stack_info:
        text += _details(record)
    return text


def _details(record: logging.LogRecord) -> str:
    formatter = logging.Formatter()
    parts = []
    if record.exc_info:
        parts.append(formatter.formatException(record.exc_info))
    elif record.exc_text:
        parts.append(record.exc_text)
    if record.stack_info:
        parts.append(formatter.formatStack(record.stack_info))
    return "\n".join(parts) + "\n"


class JobLogCapture(logging.Handler):
    """On the root logger: a record goes to the capture of the job that emitted it."""

    def __init__(self) -> None:
        super().__init__()
        self.fallback_level = logging.WARNING  # the root's level before install: lastResort's

    def handle(self, record: logging.LogRecord) -> bool:
        # No handler lock: a sink takes its own to spill, and most records belong to no job.
        sink = _current.get()
        if sink is not None:
            try:  # line(record), written out: this runs for every record of every job
                created = record.created
                milli = _milli
                stamp = milli[2] if milli[0] <= created < milli[1] else _stamp(created)
                if type(record) is _LogRecord:  # getMessage, written out (no frame)
                    message = record.msg if type(record.msg) is str else str(record.msg)
                    if record.args:
                        message = message % record.args
                else:  # a record factory's own class may format its message its own way
                    message = record.getMessage()
                text = f"{stamp} {record.levelname} {record.name}: {message}\n"
                if record.exc_info or record.exc_text or record.stack_info:
                    text += _details(record)
                # The sink's feed, written out: appending is atomic; the count only a trigger.
                sink.lines.append(text)
                sink.pending += len(text)
                if sink.pending > sink.spill_at:
                    sink.spill()
            except Exception:  # noqa: BLE001 - a record that cannot be kept: as logging does
                self.handleError(record)
        elif record.levelno >= self.fallback_level and not _handled_elsewhere(record, self):
            last = logging.lastResort
            if last is not None and record.levelno >= last.level:
                last.handle(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:  # pragma: no cover - handle() does it
        self.handle(record)


def _handled_elsewhere(record: logging.LogRecord, mine: logging.Handler) -> bool:
    """Whether another handler on the record's way to the root took it (then lastResort,
    which only speaks when nobody did, would not have spoken)."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        if any(h is not mine for h in logger.handlers):
            return True
        if not logger.propagate:
            return False
        logger = logger.parent
    return False


_installed: JobLogCapture | None = None
_install_lock = threading.Lock()  # two runner threads installing at once add one handler


def install() -> JobLogCapture:
    """Put the capture on the root logger (once per process)."""
    installed = _installed
    if installed is not None:
        return installed
    with _install_lock:
        return _installed or _install()


def _install() -> JobLogCapture:
    global _installed
    root = logging.getLogger()
    handler = JobLogCapture()
    handler.fallback_level = root.level or logging.WARNING
    if root.level > logging.INFO:
        for other in root.handlers:
            if other.level == logging.NOTSET:
                other.setLevel(handler.fallback_level)  # they print what they printed before
        root.setLevel(logging.INFO)
    root.addHandler(handler)
    _installed = handler
    return handler



def install_at_start(config: WorkerConfig) -> None:
    """At the worker's start: ``install`` if a handler's records may be kept, as far as the
    worker knows then: its ``--output-limit``, or a task schedule of its files, is not 0. A
    runtime schedule's limit is known only when its job comes (``execute.run_task`` installs
    then, and handler processes are told the level with each job)."""
    if config.output_limit > 0 or any(
            s.command is None and s.output_limit > 0 for s in config.specs.values()):
        install()

class capturing:  # noqa: N801 - used as a function: ``with capturing(job):``
    """The records emitted in this context (and the tasks it starts) go to ``job`` (the
    ``Running`` job, which keeps them as lines; None: to no job). A class rather than a
    generator: it runs around every job."""

    __slots__ = ("_job", "_token")

    def __init__(self, job: Lines | None) -> None:
        self._job = job

    def __enter__(self) -> None:
        self._token = _current.set(self._job)

    def __exit__(self, *exc: object) -> None:
        _current.reset(self._token)


class _StderrRecords(logging.Handler):
    """In a handler process: every record, as a line on stderr (the attempt's output pipe)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(line(record))
            stream.flush()
        except Exception:  # noqa: BLE001 - as logging does
            self.handleError(record)


def lower_to(level: int) -> None:
    """A handler process: records at ``level`` and above reach the root logger (the worker's
    level when it sent the job: lowered once it installed the capture)."""
    root = logging.getLogger()
    if root.level > level:
        root.setLevel(level)


def child_setup(level: int) -> None:
    """A handler process: stdout written through at each line (so that prints and records
    arrive in the order they were made), and the root logger's records written to stderr
    at ``level``, unless a handler of the application already writes them there."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(line_buffering=True, write_through=True)  # type: ignore[union-attr]
    lower_to(level)
    root = logging.getLogger()
    streams = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    if not any(isinstance(h, logging.StreamHandler) and h.stream in streams for h in root.handlers):
        root.addHandler(_StderrRecords())
