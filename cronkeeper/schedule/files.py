"""Which files a set of schedule paths names, and each file's text; whether a file's commands
may be trusted. Never raises for bad input: every problem is a :class:`Diagnostic`.

- A path may be a file (read whatever its name) or a directory: every ``*.toml`` file below it,
  in sorted order, skipping names that start with a dot (editor swap files, ``.git``) and not
  following symlinked directories. The same file reached twice is read once.
- A directory without schedule files is a **warning**: the set is valid, but probably not what
  was meant.
- A file must be UTF-8 (a leading BOM is tolerated) and at most 16 MiB; anything else is one
  error at the line where decoding failed (or line 1).
- Anything that is not a regular file or a directory (a named pipe, a socket, a device, a
  symlink loop or a dangling symlink) is never opened for reading: opening a FIFO blocks until a
  writer comes. Given directly it is an error; met in a directory it is a warning and skipped.
- A file that defines ``command`` must not be writable by group or others, nor may the
  directories that hold it, up to the directory that was given: whoever can write there could
  run code on every worker (:func:`writable_problem`; the loader reports it at the first
  ``command``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

from cronkeeper.schedule.diagnostics import Diagnostic, Severity

MAX_FILE_BYTES = 16 * 1024 * 1024

# A file to read: (path to show, root directory it was found under, None if given directly).
Found = tuple[str, str | None]


def schedule_files(
    paths: Sequence[str | os.PathLike[str]], diagnostics: list[Diagnostic]
) -> list[Found]:
    """The files ``paths`` name, in order, each once; problems with the paths go to
    ``diagnostics``."""
    files: list[Found] = []
    seen: set[str] = set()
    for raw in paths:
        path = os.fspath(raw)
        special = special_file(path)
        if special is not None and special != "missing":
            diagnostics.append(Diagnostic(path, 0, None, f"{special}, not a schedule file"))
            continue
        if os.path.isdir(path):
            found = _walk(path, diagnostics)
            if not found:
                diagnostics.append(Diagnostic(
                    path, 0, None, "no schedule files (*.toml) in this directory",
                    Severity.WARNING,
                ))  # fmt: skip
            candidates: list[Found] = [(f, path) for f in found]
        elif os.path.exists(path):
            candidates = [(path, None)]
        else:
            diagnostics.append(Diagnostic(path, 0, None, "no such file or directory"))
            continue
        for file, root in candidates:
            special = special_file(file) if root is not None else None
            if special is not None:  # met in a directory walk: say so, skip it, keep the rest
                diagnostics.append(Diagnostic(
                    file, 0, None, f"{special}, not a schedule file; skipped", Severity.WARNING
                ))  # fmt: skip
                continue
            key = os.path.realpath(file)
            if key not in seen:
                seen.add(key)
                files.append((file, root))
    return files


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def special_file(path: str) -> str | None:
    """What ``path`` is when it is neither a regular file nor a directory (``"a named pipe
    (FIFO)"``, ``"a symlink loop"`` ...), ``"missing"`` when nothing is there, else None.
    Looks with stat only: never opens the path."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symlink loop"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return "a dangling symlink"
        return "missing" if exc.errno == errno.ENOENT else None  # EACCES etc.: open() says
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((kind for test, kind in _SPECIAL_KINDS if test(mode)), "not a regular file")


def _walk(root: str, diagnostics: list[Diagnostic]) -> list[str]:
    found: list[str] = []

    def on_error(exc: OSError) -> None:
        diagnostics.append(Diagnostic(
            exc.filename or root, 0, None, f"cannot read directory: {exc.strerror}"
        ))  # fmt: skip

    for directory, dirnames, filenames in os.walk(root, onerror=on_error):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        found.extend(
            os.path.join(directory, f)
            for f in filenames
            if f.endswith(".toml") and not f.startswith(".")
        )
    return sorted(found)


def read_text(file: str) -> str | Diagnostic:
    """The text of ``file``, or the one problem that keeps it from being read."""

    def unreadable(message: str, line: int = 1) -> Diagnostic:
        return Diagnostic(file, line, None, message)

    try:
        # O_NONBLOCK: should a FIFO replace the file after special_file() looked, opening it
        # still returns at once, and fstat below refuses it before any read.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                return unreadable("not a regular file")
            if st.st_size > MAX_FILE_BYTES:
                return unreadable(f"file is too large ({st.st_size} bytes; at most 16 MiB)")
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return unreadable(f"cannot read file: {exc.strerror or exc}", 0)
    if len(data) > MAX_FILE_BYTES:
        return unreadable("file is too large (at most 16 MiB)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return unreadable(f"not a UTF-8 text file (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}); schedule files are UTF-8 TOML", line)  # fmt: skip
    return text


def writable_problem(file: str, root: str | None) -> str | None:
    """Why workers must not trust ``file``'s commands, if anyone but its owner can change it."""
    checks = [(file, "file")]
    directory = os.path.dirname(os.path.abspath(file))
    stop = os.path.abspath(root) if root is not None else directory
    while True:
        checks.append((directory, "directory"))
        if directory == stop or os.path.dirname(directory) == directory:
            break
        directory = os.path.dirname(directory)
    for path, kind in checks:
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if mode & 0o022:
            who = " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others")) if mode & bit)
            where = "this file" if kind == "file" else f"the directory {path} that holds it"
            return (f"defines 'command' but {where} is writable by {who} (mode "
                    f"{stat.S_IMODE(mode):04o}): whoever can write there can run programs on "
                    f"every worker; run chmod go-w {path}")  # fmt: skip
    return None
