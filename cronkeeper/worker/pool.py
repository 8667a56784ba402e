"""The worker side of process isolation: a pool of pre-started handler processes
(``cronkeeper.worker.child``), one job at a time each, killed at the job's timeout.

Each runner thread takes an idle child, hands it the job and waits for its answer until the
job's deadline (the clock starts once the child is ready, so start-up never eats a job's
time). Then:

- answer ``committed`` / ``lost``: the child committed the handler's transaction with the
  fenced completion (or the fence refused it); the worker records nothing more;
- answer ``succeeded`` (no transaction) or ``failed``: an ending for the recorder, as in
  thread mode;
- deadline passed: the child's process group gets SIGTERM, then SIGKILL after
  ``--kill-grace``; the job's database session (the child reports its backend pid when the
  handler opens its transaction) is ended with ``pg_terminate_backend``, so its transaction is
  rolled back at once, even mid-query; the attempt is recorded as ``timeout``;
- the pipe closed first (segfault, ``os._exit``, the OOM killer): the group is killed and the
  attempt is a retryable failure naming the signal or exit status. If the child had already
  committed the completion, the fence refuses that failure: the job stays ``succeeded``.

A child is recycled (its pipe closed, its group killed once it exits) after
``max_jobs_per_child`` jobs or once its resident memory passes ``max_child_memory_mb``, and a
replacement is started at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cronkeeper import clock
from cronkeeper.claiming import SchemaFeature
from cronkeeper.db.engine import Engine
from cronkeeper.errors import DatabaseError
from cronkeeper.output import Capture
from cronkeeper.worker.child import LAUNCH, MAX_FRAME, read_frame, write_frame
from cronkeeper.worker.classify import Ending, Kind
from cronkeeper.worker.commands import format_instant, kill_group
from cronkeeper.worker.runtime import WorkerConfig

if TYPE_CHECKING:
    from cronkeeper.worker.runtime import Running

log = logging.getLogger("cronkeeper.worker")

START_TIMEOUT = 120.0  # seconds a new child may take to import the handlers' modules
_TIMEOUT = object()


class ChildProcess:
    """One handler process, the two pipes of its protocol, and the pipe that is its stdout and
    stderr (what it prints, its log records included: ``logcapture.child_setup``), read into
    the running job's capture, or passed on to the worker's stderr between jobs."""

    def __init__(self, init: dict[str, Any]) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        printed_r, printed_w = os.pipe()
        try:
            self.popen = subprocess.Popen(  # noqa: S603 - our own module, our interpreter
                [sys.executable, "-c", LAUNCH, str(to_child_r),
                 str(from_child_w), str(os.getpid())],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                stdout=printed_w, stderr=printed_w, start_new_session=True,
            )
        except BaseException:
            os.close(printed_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
            os.close(printed_w)
        self.pid = self.popen.pid
        self._out = os.fdopen(to_child_w, "wb")
        self._in = os.fdopen(from_child_r, "rb", buffering=0)  # unbuffered: poll() is exact
        self._in_fd = from_child_r
        self._printed: int | None = printed_r
        os.set_blocking(printed_r, False)
        self._poll = select.poll()
        self._poll.register(from_child_r, select.POLLIN)
        self._poll.register(printed_r, select.POLLIN)
        self.ready = False
        self.jobs = 0
        self.rss_kib = 0
        write_frame(self._out, init)

    def read(self, deadline: float, capture: Capture | None = None) -> dict[str, Any] | None | object:
        """The next message; None when the child is gone; _TIMEOUT past ``deadline``. What
        it prints meanwhile goes to ``capture`` (None: the worker's stderr); once a message
        came, what it printed before that message is read too."""
        while True:
            remaining = deadline - clock.monotonic()
            if remaining <= 0:
                return _TIMEOUT
            try:  # poll, not select: a pool of hundreds of children passes select's fd limit
                events = self._poll.poll(max(1, int(remaining * 1000)))
            except (OSError, ValueError):
                return None
            if not events:
                return _TIMEOUT
            ready = {fd for fd, _ in events}
            if self._printed is not None and self._printed in ready:
                self.take_printed(capture)
            if self._in_fd in ready:
                break
        try:
            return read_frame(self._in)
        except (OSError, ValueError):
            return None
        finally:
            self.take_printed(capture)

    def take_printed(self, capture: Capture | None) -> None:
        """Read what the child printed so far into ``capture`` (None: the worker's stderr)."""
        fd = self._printed
        if fd is None:
            return
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # every writer is gone: the child (and what it started) ended
                self._poll.unregister(fd)
                os.close(fd)
                self._printed = None
                return
            if capture is not None:
                capture.feed(data)
            else:
                _to_stderr(data)

    def wait_ready(self) -> str | None:
        """None once the child is ready, else what went wrong."""
        if self.ready:
            return None
        msg = self.read(clock.monotonic() + START_TIMEOUT)
        if isinstance(msg, dict) and msg.get("t") == "ready":
            self.ready = True
            return None
        if msg is _TIMEOUT:
            return f"not ready after {START_TIMEOUT:g}s"
        return self.exit_text()

    def send(self, message: dict[str, Any]) -> bool:
        try:
            write_frame(self._out, message)
            return True
        except (OSError, ValueError):
            return False

    def kill(self, grace: float, capture: Capture | None = None) -> None:
        """Kill the child's process group (what the handler started too) and reap the child;
        what it printed until then goes to ``capture``."""
        kill_group(self.popen, grace)
        self.take_printed(capture)
        self._close()

    def exit_text(self) -> str:
        """After the pipe closed: the group is killed, the child reaped, its end described."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # before reaping: the pgid cannot be reused yet
        try:
            code = self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.kill(0.0)
            code = self.popen.returncode
        self._close()
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"handler process {self.pid} killed by {name}"
        return f"handler process {self.pid} exited with status {code} before the job ended"

    def retire(self, grace: float) -> None:
        """Close its pipe (it exits when idle), then kill whatever is left of its group."""
        self._close()
        self.reap(clock.monotonic() + max(grace, 0.5))

    def reap(self, deadline: float) -> None:
        """Wait until ``deadline`` for the child to exit (its pipe closed), then kill the rest."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(max(0.0, deadline - clock.monotonic()))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)

    def _close(self) -> None:
        for stream in (self._out, self._in):
            with contextlib.suppress(OSError):
                stream.close()
        fd, self._printed = self._printed, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _to_stderr(data: bytes) -> None:
    """What a handler process printed outside any job: the worker's stderr, as before."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.flush()
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()


class ProcessPool:
    """Pre-started (``start``) or started on first use, up to one child per runner thread."""

    def __init__(self, config: WorkerConfig, engine: Engine,
                 notes: SchemaFeature | None = None) -> None:
        self.config = config
        # Whether a handler's completion notes a recovery (the worker's own lookup of the schema).
        self.notes = notes if notes is not None else SchemaFeature(lambda conn: False)
        self._init = {
            "t": "init", "database_url": engine.url.render_as_string(hide_password=False),
            "schema": config.schema, "worker_id": config.worker_id,
            "imports": list(config.imports), "sys_path": list(sys.path),
        }
        self._idle: queue.SimpleQueue[ChildProcess] = queue.SimpleQueue()
        self._all: set[ChildProcess] = set()
        self._lock = threading.Lock()
        self._stopping = False
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")
        self.started_total = 0

    def start(self) -> None:
        for _ in range(self.config.concurrency):
            self._idle.put(self._spawn())
        log.info("handler processes started: count=%d max_jobs=%d max_memory_mb=%d",
                 self.config.concurrency, self.config.max_jobs_per_child,
                 self.config.max_child_memory_mb, extra={"action": "handler_processes_started"})

    def _spawn(self) -> ChildProcess:
        # From one long-lived thread: a child's PR_SET_PDEATHSIG fires when the *thread* that
        # started it ends, and runner threads may end (abandoned by a timed-out sync handler).
        # Records at the level the worker's root logger passes (logcapture.install).
        init = {**self._init, "log_level": logging.getLogger().getEffectiveLevel()}
        child = self._spawner.submit(ChildProcess, init).result()
        with self._lock:
            self._all.add(child)
            self.started_total += 1
        return child

    def _take(self) -> ChildProcess:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return self._spawn()

    def _drop(self, child: ChildProcess, replace: bool) -> None:
        with self._lock:
            self._all.discard(child)
            stopping = self._stopping
        if replace and not stopping:
            self._idle.put(self._spawn())

    def run(self, held: Running, end_session: Any) -> Ending | str:
        """Run the held job in a child: its Ending, or the child's ``done`` (committed, lost)."""
        size = len(held.job.payload_json)
        if size > MAX_FRAME // 2:
            return Ending(Kind.PERMANENT, f"payload of {size} bytes is too large to hand to a "
                          f"handler process (at most {MAX_FRAME // 2})")
        child = self._take()
        # Under the job's lock, as the drain settles it: either the drain sees this child (and
        # kills its group) or this sees the release and hands the job to no child.
        with held.lock:
            held.proc = child.popen  # the supervisor leaves it alone; a drain kills its group
            released = held.done
        if released:
            self._idle.put(child)
            return Ending(Kind.RETRYABLE, "released before it started")  # settled already
        try:
            return self._run(child, held, end_session)
        except BaseException:
            child.kill(0.0)  # a child in an unknown state is never handed another job
            self._drop(child, replace=True)
            raise

    def _run(self, child: ChildProcess, held: Running, end_session: Any) -> Ending | str:
        cfg, job = self.config, held.job
        problem = child.wait_ready()
        if problem is not None:
            self._drop(child, replace=True)
            return Ending(Kind.RETRYABLE, f"handler process did not start: {problem}")
        held.deadline = clock.monotonic() + job.timeout
        sent = child.send({
            "t": "job", "id": job.id, "key": job.key, "attempt": job.attempt,
            "schedule": job.schedule, "task": job.task, "payload_json": job.payload_json,
            "scheduled_for": format_instant(job.scheduled_for) or None,
            "note": self.notes.present,
            # The worker may have lowered its root logger since this child started
            # (logcapture.install before the first job that keeps output).
            "log_level": logging.getLogger().getEffectiveLevel(),
        })
        backend: int | None = None
        capture = held.capture
        while True:
            msg = child.read(held.deadline, capture) if sent else None
            if msg is _TIMEOUT:
                child.kill(cfg.kill_grace, capture)
                self._drop(child, replace=True)
                if backend is not None:
                    end_session(backend)
                log.error("task timed out: job=%d key=%s attempt=%d timeout=%.1fs: handler "
                          "process %d and its group killed", job.id, job.key, job.attempt,
                          job.timeout, child.pid, extra={"action": "task_timed_out"})
                return Ending(Kind.TIMEOUT, f"timed out after {job.timeout:g}s: handler process "
                              f"{child.pid} and its process group killed")
            if not isinstance(msg, dict):
                child.take_printed(capture)  # a crash's last words
                text = child.exit_text()
                self._drop(child, replace=not held.released)  # a drain needs no replacement
                if backend is not None:
                    end_session(backend)
                if not held.released:  # a drain kills what it releases: no news
                    log.warning("handler process died: job=%d key=%s attempt=%d: %s", job.id,
                                job.key, job.attempt, text,
                                extra={"action": "handler_process_died"})
                return Ending(Kind.RETRYABLE, text)
            if msg.get("t") == "session":
                backend = int(msg["backend_pid"])
                continue
            break
        child.jobs, child.rss_kib = int(msg.get("jobs", 0)), int(msg.get("rss_kib", 0))
        self._recycle_or_keep(child)
        if msg["done"] == "failed":
            return Ending(Kind(msg["kind"]), msg.get("error") or "")
        if msg["done"] == "succeeded":
            return Ending(Kind.SUCCEEDED)
        return str(msg["done"])  # committed | lost

    def _recycle_or_keep(self, child: ChildProcess) -> None:
        cfg = self.config
        why = ""
        if cfg.max_jobs_per_child and child.jobs >= cfg.max_jobs_per_child:
            why = f"after {child.jobs} jobs"
        elif cfg.max_child_memory_mb and child.rss_kib > cfg.max_child_memory_mb * 1024:
            why = f"at {child.rss_kib // 1024} MiB resident"
        if not why:
            self._idle.put(child)
            return
        log.info("handler process recycled: pid=%d %s", child.pid, why,
                 extra={"action": "handler_process_recycled"})
        self._drop(child, replace=True)
        threading.Thread(target=child.retire, args=(cfg.kill_grace,), name="retire",
                         daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            children = list(self._all)
            self._all.clear()
        for child in children:  # all pipes first: the children exit side by side
            child._close()
        deadline = clock.monotonic() + max(self.config.kill_grace, 0.5)
        for child in children:
            child.reap(deadline)
        self._spawner.shutdown(wait=False)


def end_session(db: Any) -> Any:
    """A callable that ends a killed handler's database session (its transaction rolls back)."""
    from cronkeeper.db.sessions import handler_session_terminate

    def end(pid: int) -> None:
        try:
            with db.transaction("ending a killed handler's database session") as conn:
                handler_session_terminate(conn, pid)
        except DatabaseError:
            pass  # the server still rolls it back when it notices the closed socket

    return end
