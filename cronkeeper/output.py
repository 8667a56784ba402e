"""What a job printed (pure): one attempt's output kept within a limit, and how it is shown.

``Capture`` keeps the bytes an attempt printed, in the order they arrived: all of them when
they fit in ``limit``; past it exactly the first ``limit // 2`` bytes and the last
``limit - limit // 2``, with the line ``[cronkeeper: N bytes left out]`` between them (N: the
bytes between the two halves). Memory stays within about twice the limit however much the job
prints. It takes bytes only: a command's or a handler process's pipe as it is read, and a
handler's log records from its job (``runtime.Running``), which keeps them as lines and feeds
its capture their bytes once they pass the limit. ``feed`` may be called from several threads.

Showing it: ``for_terminal`` (bytes as text, invalid UTF-8 as ``\\xNN``, control characters
other than newline and tab escaped with ``safe``, the project's one escaping helper),
``as_text`` (invalid UTF-8 replaced: the web's plain-text view), ``last_lines`` (explain's last
10 lines, escaped) and ``tail_text`` (the tail a dead letter's ``last_error`` keeps)."""

from __future__ import annotations

import threading

from cronkeeper.schedule.diagnostics import safe

DEFAULT_LIMIT = 64 * 1024  # the schedule key ``output_limit``'s default
MAX_LIMIT = 1024 * 1024  # the most ``output_limit`` may be
TAIL_LINES = 10  # what explain shows of each attempt, and last_error keeps of the last
TAIL_BYTES = 2000  # at most this much of those lines in last_error (the end of a long line)
# The bytes ``last_lines`` reads back from the database for an attempt's last lines.
TAIL_WINDOW = 16 * 1024


def left_out_line(count: int) -> bytes:
    """The line a capture puts between the head and the tail it kept."""
    return b"[cronkeeper: %d bytes left out]\n" % count


class Capture:
    """One attempt's output, capped at ``limit`` bytes (head and tail, see the module)."""

    __slots__ = ("_closed", "_head", "_lock", "_tail", "_value", "head_size", "limit", "tail_size",
                 "total")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a capture needs a limit of at least 1 byte, not {limit}")
        self.limit = limit
        self.head_size = limit // 2
        self.tail_size = limit - self.head_size
        self.total = 0  # bytes fed so far, kept or not
        self._head = bytearray()
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._closed = False
        self._value: bytes | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append what arrived (ignored once closed: the attempt has ended)."""
        if not data:
            return
        with self._lock:
            self._feed(data)

    def _feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            return
        self.total += len(data)
        room = self.head_size - len(self._head)
        if room > 0:
            if len(data) <= room:
                self._head += data
                return
            view = memoryview(data)
            self._head += view[:room]
            data = view[room:]
        tail = self._tail
        tail += data
        # Trim only when the tail holds twice what it keeps: each trim drops at least
        # tail_size bytes, so trimming costs O(1) per byte fed, however small the feeds.
        if len(tail) > 2 * self.tail_size + 4096:
            del tail[: len(tail) - self.tail_size]

    def close(self) -> bytes:
        """End the capture (later feeds are ignored) and return what it kept."""
        with self._lock:
            if self._value is None:
                self._closed = True
                self._value = self._render()
            return self._value

    def _render(self) -> bytes:
        if self.total <= self.limit:
            return bytes(self._head + self._tail) if self._tail else bytes(self._head)
        head = bytes(self._head)
        tail = bytes(self._tail[len(self._tail) - self.tail_size:])
        separator = b"\n" if head and not head.endswith(b"\n") else b""
        return head + separator + left_out_line(self.total - self.head_size - self.tail_size) + tail


def as_text(data: bytes) -> str:
    """The output as text, invalid UTF-8 replaced (U+FFFD)."""
    return data.decode("utf-8", "replace")


def escape_text(text: str) -> str:
    """Control characters other than newline and tab escaped (``safe``, line by line)."""
    return "\n".join(map(safe, text.split("\n")))


def for_terminal(data: bytes) -> str:
    """The output for a terminal: invalid UTF-8 as ``\\xNN``, control characters other than
    newline and tab escaped, so that nothing a job printed can move the cursor, retitle the
    window or hide a line."""
    return escape_text(data.decode("utf-8", "backslashreplace"))


def last_lines(data: bytes, count: int = TAIL_LINES) -> list[str]:
    """The last ``count`` lines (a final newline ends the last line, it does not start
    another), as text and escaped for a terminal or a page."""
    if not data:
        return []
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [for_terminal(line) for line in lines[-count:]]


def tail_text(data: bytes | None, count: int = TAIL_LINES, most: int = TAIL_BYTES) -> str:
    """The last ``count`` lines as text (invalid UTF-8 replaced, control characters kept: the
    renderer escapes), at most ``most`` characters of them (their end): what a dead letter's
    ``last_error`` keeps of its last attempt's output. '' when it printed nothing."""
    if not data:
        return ""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    text = as_text(b"\n".join(lines[-count:]))
    return text[-most:]


TAIL_HEADING = "\noutput (last lines):\n"


def with_tail(error: str, data: bytes | None) -> str:
    """An attempt's error followed by the tail of its output (``last_error``)."""
    tail = tail_text(data)
    if not tail:
        return error
    return f"{error}{TAIL_HEADING}{tail}"


def split_tail(last_error: str) -> tuple[str, str]:
    """``with_tail``'s text back into (error, tail): a notification shows them apart ('' when
    the error carries no tail)."""
    error, found, tail = last_error.partition(TAIL_HEADING)
    return (error, tail) if found else (last_error, "")
