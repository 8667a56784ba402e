"""Schedule files -> a :class:`LoadResult`: the valid schedules, and every problem at once.

Choices (docs/schedules.md repeats them for operators):

- Which files a path names, how a file is read as text, and which files may define
  ``command``: :mod:`cronkeeper.schedule.files`.
- A file that defines no schedule (empty, or only comments) is a **warning**: the set is valid,
  but probably not what was meant.
- A TOML syntax error makes the whole file unreadable: one error at the line TOML reports.
- A file that defines ``command`` and is writable by group or others (or sits in a directory
  that is) is one error, at its first ``command``, and none of its schedules is loaded.
- A name defined twice (in one directory or across paths) is an error at each definition, and
  neither copy is loaded.
- The top-level table ``calendars`` holds calendars, not a schedule (``schedule.calendars``):
  a calendar may be defined in any file, so a schedule's ``calendar`` is resolved once every
  file is read.

``load_paths`` never raises for bad input; ``load_valid`` raises :class:`ScheduleError`.
"""
from __future__ import annotations

import contextlib
import gc
import os
import re
import signal
import sys
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cronkeeper.errors import ScheduleError
from cronkeeper.schedule import calendars as cal
from cronkeeper.schedule import fasttoml
from cronkeeper.schedule.diagnostics import Diagnostic, Severity
from cronkeeper.schedule.files import read_text, schedule_files, writable_problem
from cronkeeper.schedule.lines import LineIndex
from cronkeeper.schedule.model import ScheduleSet, ScheduleSpec
from cronkeeper.schedule.validate import Memo, check_schedule

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_LINE = re.compile(r"\s*\(at line (\d+)\)\s*$")


@dataclass(frozen=True)
class LoadResult:
    """What a set of schedule files holds. Only valid schedules are in ``schedules``."""

    schedules: ScheduleSet
    errors: list[Diagnostic]
    warnings: list[Diagnostic]
    files: tuple[str, ...] = ()
    # Schedules defined, valid or not (the "N schedules" of validate's summary).
    defined: int = 0
    diagnostics: list[Diagnostic] = field(default_factory=list)  # errors and warnings, in order

    @property
    def valid(self) -> bool:
        return not self.errors


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Reading makes millions of containers and no reference cycles; the cyclic collector would
    walk them over and over as they pile up (a third of the CPU time at 100,000 schedules)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def load_paths(
    paths: Sequence[str | os.PathLike[str]],
    *,
    now: datetime,
    keep_specs: bool = True,
    keep_warnings: bool = True,
) -> LoadResult:
    """Read every schedule file under ``paths``. ``now`` (aware) anchors the DST look-ahead.

    ``keep_specs=False``: only the diagnostics and counts are wanted (``validate``); the
    result's ``schedules`` is then empty, and the specs of repeated tables are never made.
    ``keep_warnings=False``: the schedules' warnings are not made (``load_valid``, the daemon:
    a generated set can have one per schedule, and nobody reads them there).
    """
    with _collector_paused():
        return _load_paths(paths, now, (keep_specs, keep_warnings))


# (keep_specs, keep_warnings) of load_paths.
Wanted = tuple[bool, bool]


def _load_paths(
    paths: Sequence[str | os.PathLike[str]], now: datetime, wanted: Wanted
) -> LoadResult:
    diagnostics: list[Diagnostic] = []
    files = schedule_files(paths, diagnostics)

    specs: list[ScheduleSpec] = []
    defined = 0
    first_seen: dict[str, tuple[str, int]] = {}
    duplicates: set[str] = set()
    calendar_defs: list[cal.CalendarDef] = []
    calendar_refs: list[cal.CalendarRef] = []
    for (file, _), (file_specs, names, file_diags, defs, refs) in zip(
        files, _load_files(files, now, wanted), strict=True
    ):
        diagnostics.extend(file_diags)
        calendar_defs.extend(defs)
        calendar_refs.extend(refs)
        defined += len(names)
        for name, line in names:
            if name in first_seen:
                duplicates.add(name)
                other_file, other_line = first_seen[name]
                diagnostics.append(Diagnostic(
                    file, line, name,
                    f"duplicate schedule name: also defined at {other_file}:{other_line}",
                ))  # fmt: skip
                diagnostics.append(Diagnostic(
                    other_file, other_line, name,
                    f"duplicate schedule name: also defined at {file}:{line}",
                ))  # fmt: skip
            else:
                first_seen[name] = (file, line)
        specs.extend(file_specs)

    resolved, unresolved, calendar_diags = cal.resolve(calendar_defs, calendar_refs)
    diagnostics.extend(calendar_diags)
    order = {file: i for i, (file, _) in enumerate(files)}
    diagnostics.sort(key=lambda d: (order.get(d.file, -1), d.line))
    return LoadResult(
        schedules=ScheduleSet(tuple(
            s.with_calendar(resolved[s.name]) if s.name in resolved else s
            for s in specs if s.name not in duplicates and s.name not in unresolved),
            cal.defined(calendar_defs)),
        errors=[d for d in diagnostics if d.severity is Severity.ERROR],
        warnings=[d for d in diagnostics if d.severity is Severity.WARNING],
        files=tuple(file for file, _ in files),
        defined=defined,
        diagnostics=diagnostics,
    )


def load_valid(paths: Sequence[str | os.PathLike[str]], *, now: datetime) -> ScheduleSet:
    """The schedules under ``paths``; :class:`ScheduleError` listing every error if any."""
    result = load_paths(paths, now=now, keep_warnings=False)
    if result.errors:
        count = len(result.errors)
        lines = "\n".join(d.render() for d in result.errors)
        raise ScheduleError(
            f"{count} error{'s' if count != 1 else ''} in schedule files:\n{lines}", result.errors
        )
    return result.schedules


# (valid specs, (name, line) of every schedule defined, diagnostics, calendars defined,
# calendars named by valid schedules)
FileResult = tuple[list[ScheduleSpec], list[tuple[str, int]], list[Diagnostic],
                   list[cal.CalendarDef], list[cal.CalendarRef]]
# Below this many bytes of files, forking readers costs more than it saves.
PARALLEL_BYTES = 4 * 1024 * 1024
MAX_READERS = 8


def _load_chunk(files: list[tuple[str, str | None]], now: datetime, wanted: Wanted):
    memo = Memo()  # valid tables checked so far, by their text (see check_schedule)
    return [_load_file(file, root, now, memo, wanted) for file, root in files]


def _load_files(
    files: list[tuple[str, str | None]], now: datetime, wanted: Wanted, readers: int = 0
) -> list[FileResult]:
    """Each file's result, in order. When only diagnostics are wanted (``validate``), on Linux,
    with several CPUs and megabytes to read, the files are split in contiguous runs of about
    equal size and read by forked processes at once (this one reads the first run): a file's
    result does not depend on the others, and the results are put back in file order, so the
    output is the one a single process gives. Specs are never sent back (100,000 of them cost
    more to pickle than to make), so the daemon reads in one process."""
    readers = readers or (_readers(files) if not wanted[0] else 1)
    if readers <= 1:
        return _load_chunk(files, now, wanted)
    chunks = _split(files, readers)
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context

    try:  # Ctrl-C is the parent's to handle: the readers ignore it and finish their runs
        with ProcessPoolExecutor(
            readers - 1, get_context("fork"), signal.signal, (signal.SIGINT, signal.SIG_IGN)
        ) as pool:
            futures = [pool.submit(_load_chunk, chunk, now, wanted) for chunk in chunks[1:]]
            results = _load_chunk(chunks[0], now, wanted)
            for future in futures:
                results.extend(future.result())
    except (BrokenProcessPool, OSError):  # no processes to be had: read them here
        return _load_chunk(files, now, wanted)
    return results


def _readers(files: list[tuple[str, str | None]]) -> int:
    if sys.platform != "linux" or len(files) < 2:
        return 1
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        return 1
    size = 0
    for file, _ in files:
        with contextlib.suppress(OSError):
            size += os.stat(file).st_size
    return max(1, min(cpus, MAX_READERS, len(files), size // (PARALLEL_BYTES // 2)))


def _split(files: list[tuple[str, str | None]], parts: int) -> list[list[tuple[str, str | None]]]:
    """Contiguous runs of files of about equal total size."""
    sizes = []
    for file, _ in files:
        try:
            sizes.append(max(os.stat(file).st_size, 1))
        except OSError:
            sizes.append(1)
    total = sum(sizes)
    chunks: list[list[tuple[str, str | None]]] = [[]]
    done = 0
    for entry, size in zip(files, sizes, strict=True):
        if done >= total * len(chunks) / parts and len(chunks) < parts:
            chunks.append([])
        chunks[-1].append(entry)
        done += size
    return chunks


def _load_file(
    file: str, root: str | None, now: datetime, memo: Memo, wanted: Wanted
) -> FileResult:
    """The :data:`FileResult` of one file."""
    diags: list[Diagnostic] = []

    def fail(message: str, line: int = 1) -> FileResult:
        diags.append(Diagnostic(file, line, None, message))
        return [], [], diags, [], []

    text = read_text(file)
    if isinstance(text, Diagnostic):
        return [], [], [text], [], []
    fast = fasttoml.parse(text)
    index: fasttoml.Lines | LineIndex
    if fast is not None:
        doc, index = fast
    else:
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            message, line = _toml_error(str(exc))
            return fail(f"invalid TOML: {message}", line)
        except RecursionError as exc:
            return fail("invalid TOML: arrays or inline tables nested too deeply to read",
                        _deepest_line(text, exc))
        index = LineIndex(text)
    specs: list[ScheduleSpec] = []
    names: list[tuple[str, int]] = []
    command_line: tuple[str, int] | None = None
    defs: list[cal.CalendarDef] = []
    refs: list[cal.CalendarRef] = []
    for name, table in doc.items():
        if name == cal.CALENDARS_KEY:
            found, calendar_diags = cal.read_calendars(table, file=file, line_of=index.line,
                                                       now=now, warnings=wanted[1])
            defs.extend(found)
            diags.extend(calendar_diags)
            continue
        if not isinstance(table, dict):
            diags.append(Diagnostic(file, index.line(name), None, _not_a_table(name, table)))
            continue

        def line_of(*path: str, _name: str = name) -> int:
            return index.line(_name, *path)

        names.append((name, line_of()))
        spec, schedule_diags = check_schedule(
            name, table, file=file, line_of=line_of, now=now, memo=memo,
            spec_needed=wanted[0], warnings_needed=wanted[1],
        )  # fmt: skip
        if schedule_diags:
            diags.extend(schedule_diags)
        if spec is not None and wanted[0]:
            specs.append(spec)
        if "calendar" in table and cal.name_problem(table["calendar"]) is None:
            refs.append(cal.CalendarRef(name, table["calendar"], file, line_of("calendar")))
        if "command" in table and command_line is None:
            command_line = (name, line_of("command"))

    if not doc:
        diags.append(Diagnostic(file, 1, None, "file defines no schedules", Severity.WARNING))
    if command_line is not None:
        problem = writable_problem(file, root)
        if problem is not None:
            name, line = command_line
            diags.append(Diagnostic(file, line, name, problem))
            specs = []
    return specs, names, diags, defs, refs


def _deepest_line(text: str, exc: RecursionError) -> int:
    """The line tomllib was reading when it ran out of stack: the position held by the deepest
    of its frames (its parsing functions take the text and a position, ``pos``), else 1."""
    pos = None
    tb = exc.__traceback__
    while tb is not None:
        held = tb.tb_frame.f_locals.get("pos")
        if type(held) is int:
            pos = held
        tb = tb.tb_next
    return 1 if pos is None else text.count("\n", 0, pos) + 1


def _toml_error(text: str) -> tuple[str, int]:
    m = _TOML_POSITION.search(text)
    if m:
        return f"{text[: m.start()]} at column {m.group(2)}", int(m.group(1))
    m = _TOML_LINE.search(text)
    if m:
        return text[: m.start()], int(m.group(1))
    return text, 1


def _not_a_table(name: str, value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        return (f"'{name}' is an array of tables ([[{name}]]); a schedule is one table: "
                f"write [{name}]")  # fmt: skip
    return (f"top-level key '{name}' is not a schedule: each schedule is a table, a line "
            "[schedule-name] followed by its keys (cron = ..., timezone = ...)")  # fmt: skip
