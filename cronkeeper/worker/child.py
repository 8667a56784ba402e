"""A pooled handler process (``--isolation process``), started as ``python -c LAUNCH R W PARENT``.

Started by the worker with ``subprocess.Popen(..., start_new_session=True)``: a fresh
interpreter (never a fork of the worker, whose other threads may hold locks at fork time), the
leader of a process group of its own, so that killing the group at a job's timeout also kills
whatever the handler started. It dies with the worker (``PR_SET_PDEATHSIG``) and exits when
the worker closes its pipe.

Protocol: length-prefixed JSON frames on two pipes (file descriptors R and W). Nothing is
pickled; what crosses is what the outbox row holds. Its stdout and stderr are a third pipe,
which the worker reads into the running job's output (``logcapture.child_setup`` writes the
root logger's records there too, and makes stdout write through at each line); everything is
flushed before the answer, so the worker has all a job printed when it reads "done".

    worker -> child   {"t": "init", "database_url", "schema", "worker_id", "imports", "sys_path",
                       "log_level"}
    child -> worker   {"t": "ready", "pid"}
    worker -> child   {"t": "job", "id", "key", "attempt", "schedule", "scheduled_for", "task",
                       "payload_json", "note", "log_level"}   (the worker's level now)
    child -> worker   {"t": "session", "backend_pid"}           (the job's transaction opened)
    child -> worker   {"t": "done", "done": Done, "kind", "error", "jobs", "rss_kib"}

The child commits the handler's transaction *with* the job's fenced completion on its own
connection (``done = committed``; ``lost`` when the fence refused it); a handler that used no
transaction reports ``succeeded`` and the worker's recorder completes the job in a batch.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import struct
import sys
from datetime import datetime
from typing import IO, Any

# Run as the importable module (not a ``__main__`` copy of it), so there is one of each function.
LAUNCH = "import sys; from cronkeeper.worker.child import main; sys.exit(main(sys.argv))"
_HEADER = struct.Struct(">I")
MAX_FRAME = 16 * 1024 * 1024


def write_frame(stream: IO[bytes], message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def read_frame(stream: IO[bytes]) -> dict[str, Any] | None:
    """The next frame, or None at end of file (the other side is gone)."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    data = _read_exactly(stream, size)
    return None if data is None else json.loads(data)


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def rss_kib() -> int:
    """Resident memory now (Linux /proc; the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the worker dies (Linux); otherwise the closed pipe ends us when idle."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(1)  # the worker died before the line above took effect


class _Child:
    def __init__(self, out: IO[bytes], init: dict[str, Any]) -> None:
        from cronkeeper.db.engine import make_engine, normalize_url

        self.out = out
        self.worker_id: str = init["worker_id"]
        self.schema: str = init["schema"]
        from cronkeeper.db.sessions import HANDLER_APPLICATION

        self.engine = make_engine(normalize_url(init["database_url"]), self.schema, pool_size=1,
                                  application_name=HANDLER_APPLICATION)
        self.jobs = 0

    def report_session(self, conn: Any) -> None:
        from cronkeeper.db.sessions import backend_pid

        write_frame(self.out, {"t": "session", "backend_pid": backend_pid(conn)})

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        from cronkeeper.worker.classify import exception_ending
        from cronkeeper.worker.invoke import Done, Result, call_async, call_sync
        from cronkeeper.worker.registry import resolve

        fields = {
            "key": job["key"], "attempt": job["attempt"], "schedule": job["schedule"],
            "scheduled_for": (datetime.fromisoformat(job["scheduled_for"])
                              if job["scheduled_for"] else None),
            "task": job["task"], "job_id": job["id"], "schema": self.schema, "engine": self.engine,
            "on_open": self.report_session, "note": bool(job.get("note")),
        }
        try:
            handler = resolve(job["task"])
            payload = handler.prepare(json.loads(job["payload_json"]))
            if handler.is_async:
                from cronkeeper.db.sessions import HANDLER_APPLICATION
                from cronkeeper.worker.async_context import AsyncJobContext

                ctx = AsyncJobContext(**fields, application_name=HANDLER_APPLICATION)
                result = call_async(handler.func, payload, ctx, self.worker_id, timeout=None,
                                    grace=0.0)
            else:
                from cronkeeper.worker.context import JobContext

                result = call_sync(handler.func, payload, JobContext(**fields), self.worker_id)
        except Exception as exc:  # noqa: BLE001 - resolving or shaping failed: classified
            result = Result(Done.FAILED, exception_ending(exc))
        self.jobs += 1
        ending = result.ending
        return {"t": "done", "done": str(result.done), "jobs": self.jobs, "rss_kib": rss_kib(),
                "kind": str(ending.kind) if ending else None,
                "error": ending.error if ending else ""}


def main(argv: list[str]) -> int:
    read_fd, write_fd = int(argv[1]), int(argv[2])
    _die_with_parent(int(argv[3]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when a handler stops
    inp = os.fdopen(read_fd, "rb")
    out = os.fdopen(write_fd, "wb")
    init = read_frame(inp)
    if init is None:
        return 0
    sys.path[:] = init["sys_path"]
    from cronkeeper.worker.logcapture import child_setup, lower_to
    from cronkeeper.worker.registry import import_modules

    import_modules(list(init["imports"]))
    child_setup(int(init.get("log_level", logging.INFO)))
    child = _Child(out, init)
    try:
        write_frame(out, {"t": "ready", "pid": os.getpid()})
        while (job := read_frame(inp)) is not None:
            if "log_level" in job:
                lower_to(int(job["log_level"]))
            reply = child.run(job)
            _flush_printed()  # all it printed is in the pipe before the worker hears "done"
            _reply(out, reply)
    except BrokenPipeError:
        pass  # the worker closed our pipe (recycled, stopping, or gone): nothing left to tell
    finally:
        child.engine.dispose()
    return 0


def _flush_printed() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def _reply(out: IO[bytes], reply: dict[str, Any]) -> None:
    """Tell the worker how the job ended (a test replaces this to die right after a commit)."""
    write_frame(out, reply)

