"""`cronkeeper import crontab|celery-beat`: arrive from cron or Celery beat (docs/import.md).

Schedule files go to stdout, or with ``-o DIR`` into ``DIR/<name>.toml`` (DIR created if missing;
files 0644, written whole through a temporary file and a rename); names another file under DIR
defines are avoided (importing.naming.apart), so several crontabs can share DIR. Every line or
entry not converted is reported on stderr as ``FILE:LINE: reason`` (``entry NAME: reason``);
caveats of converted ones as ``FILE:LINE: warning: ...``. Exit 0 when everything was
converted, 1 when something was left out (the rest is still written), 2 on unusable input, with
nothing written.
``--compare`` prints the old system's fires beside cronkeeper's (instead of the TOML on stdout,
unless ``-o`` is given).
"""

from __future__ import annotations

import os
import sys
import tempfile
import tomllib
from datetime import UTC, datetime

import click

from cronkeeper import clock
from cronkeeper.errors import UnusableInput as Unusable
from cronkeeper.errors import UsageError
from cronkeeper.importing.model import Conversion

MAX_BYTES = 16 * 1024 * 1024
MISFIRE = click.Choice(["skip", "catch_up", "latest"])


def read_text(path: str) -> str:
    """The text of a crontab; Unusable (exit 2) for anything that is not a readable text file.
    Never opens a FIFO, socket or device (see schedule.files.special_file)."""
    from cronkeeper.schedule.files import special_file

    if path == "-":
        data = sys.stdin.buffer.read(MAX_BYTES + 1)
    else:
        special = special_file(path)
        if special == "missing":
            raise Unusable(f"{path}: no such file")
        if special is not None:
            raise Unusable(f"{path}: {special}, not a crontab file")
        if os.path.isdir(path):
            raise Unusable(f"{path}: a directory, not a crontab file (give a file, e.g. "
                           f"{path.rstrip('/')}/<name>)")  # fmt: skip
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_BYTES + 1)
        except OSError as exc:
            raise Unusable(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise Unusable(f"{path}: larger than 16 MiB; no crontab is")
    if b"\0" in data:
        raise Unusable(f"{path}: a binary file (NUL byte at offset {data.index(0)}), not a crontab")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise Unusable(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                       f"{exc.start}); schedule files are UTF-8: convert it first, e.g. with "
                       "iconv -f latin1 -t utf-8") from None  # fmt: skip


def _write(directory: str, files: list[tuple[str, str]]) -> None:
    os.makedirs(directory, mode=0o755, exist_ok=True)
    mode = os.stat(directory).st_mode
    if mode & 0o022:
        click.echo(f"warning: {directory} is writable by group or others (mode "
                   f"{mode & 0o777:04o}): validate and the worker refuse 'command' schedules "
                   f"there; run chmod go-w {directory}", err=True)  # fmt: skip
    for name, text in files:
        target = os.path.join(directory, name)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, 0o644)  # never group/other-writable: validate refuses that for commands
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def _names_in(directory: str | None, own: str) -> dict[str, str]:
    """The schedule names the ``*.toml`` files under DIR define (name -> file), as validate
    reads DIR, except ``DIR/own``: the file this import rewrites. A file that cannot be read or
    parsed is passed over (validate names it); no DIR, no names."""
    if directory is None or not os.path.isdir(directory):
        return {}
    own_path = os.path.join(directory, own)
    found: dict[str, str] = {}
    for root, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = os.path.join(root, name)
            if not name.endswith(".toml") or name.startswith(".") or path == own_path:
                continue
            try:
                doc = tomllib.loads(read_text(path))
            except (Unusable, tomllib.TOMLDecodeError, RecursionError):
                continue
            for schedule, table in doc.items():
                if isinstance(table, dict):
                    found.setdefault(schedule, path)
    return found


def _start(value: str | None) -> datetime:
    from cronkeeper.timing import parse_instant

    if value is None:
        now = clock.wall().astimezone(UTC)
    else:
        try:
            now = parse_instant(value)
        except ValueError as exc:
            raise UsageError(f"--from: {exc}") from None
    return now.replace(second=0, microsecond=0)


def _finish(conversion: Conversion, output: str | None, compare, days: int) -> None:
    from cronkeeper.importing import render

    text, conversion = render.render(conversion, clock.wall())
    for problem in conversion.problems:
        click.echo(problem.render(), err=True)
    if output is not None:
        files = [(f"{conversion.stem}.toml", text)] if conversion.entries else []
        files += list(conversion.extra)
        _write(output, files)
        for name, _ in files:
            click.echo(f"wrote {os.path.join(output, name)}", err=True)
    elif compare is None:
        click.echo(text, nl=False)
        for name, extra in conversion.extra:
            click.echo(f"\n# ---- {name} (not written without -o) ----\n{extra}", err=True)
    if compare is not None:
        click.echo(compare(conversion))
    n, left = len(conversion.entries), conversion.left_out
    click.echo(f"{n} schedule{'s' if n != 1 else ''} converted, {left} left out", err=True)
    if left:
        raise SystemExit(1)


def _check_output(output: str | None) -> None:
    if output is not None and os.path.exists(output) and not os.path.isdir(output):
        raise UsageError(f"-o {output}: exists and is not a directory")


def common(func):
    for option in reversed([
        click.option("--misfire", type=MISFIRE, required=True,
                      help="Misfire policy of every converted schedule (docs/schedules.md)."),
        click.option("--owner", default=None, help="owner of every converted schedule."),
        click.option("-o", "--output", metavar="DIR", default=None,
                     help="Write DIR/<name>.toml (created if missing) instead of stdout."),
        click.option("--compare", is_flag=True,
                     help="Print the old system's fires beside cronkeeper's, differences marked."),
        click.option("--days", type=click.IntRange(1, 3660), default=365, show_default=True,
                     help="How many days --compare covers."),
        click.option("--from", "start", metavar="ISO", default=None,
                     help="Where --compare starts (default: now)."),
    ]):  # fmt: skip
        func = option(func)
    return func


@click.group("import")
def import_command() -> None:
    """Convert a crontab or a Celery beat schedule into schedule files."""


@import_command.command("crontab")
@click.argument("file", metavar="FILE")
@click.option("--timezone", required=True,
              help="The zone cron ran in (the host's), for lines no CRON_TZ/TZ line governs.")
@click.option("--system/--user", "system", default=None,
              help="A system crontab (a user field before the command). Default: by path, "
                   "/etc/crontab and /etc/cron.d/* are.")
@common
def crontab_command(file, timezone, system, misfire, owner, output, compare, days, start) -> None:
    """Convert a crontab FILE ('-' for stdin) into schedule files."""
    from cronkeeper.importing import compare as cmp
    from cronkeeper.importing import crontab
    from cronkeeper.timing import TimingError, load_zone

    _check_output(output)
    try:
        load_zone(timezone)
    except TimingError as exc:
        raise UsageError(f"--timezone: {exc}") from None
    begin = _start(start)
    text = read_text(file)
    if system is None:
        system = crontab.is_system_path(os.path.abspath(file))
    source = "stdin" if file == "-" else file
    taken = _names_in(output, f"{crontab.stem_of(source)}.toml")
    conversion = crontab.convert(text, source=source, timezone=timezone, misfire=misfire,
                                 owner=owner, system=system, taken=taken)  # fmt: skip

    def show(done: Conversion) -> str:
        sides = cmp.crontab_sides(done.entries, timezone, begin, days)
        return cmp.render(sides, "cronie", days, begin)

    _finish(conversion, output, show if compare else None, days)


@import_command.command("celery-beat")
@click.argument("app_spec", metavar="MODULE:APP")
@click.option("--timezone", default=None,
              help="Only for an app with no timezone setting and enable_utc = False.")
@common
def celery_beat_command(app_spec, timezone, misfire, owner, output, compare, days, start) -> None:
    """Convert the beat_schedule of the Celery app MODULE:APP into schedule files."""
    from cronkeeper.importing import celerybeat
    from cronkeeper.importing import compare as cmp

    _check_output(output)
    begin = _start(start)
    app = celerybeat.load_app(app_spec)  # UnusableInput: exit 2, nothing written
    taken = _names_in(output, f"{celerybeat.stem_of(app_spec)}.toml")
    conversion = celerybeat.convert(app, source=app_spec, misfire=misfire, owner=owner,
                                    timezone=timezone, taken=taken)  # fmt: skip

    def show(done: Conversion) -> str:
        sides = cmp.celery_sides(done.entries, begin, days, celerybeat.beat_fires)
        return cmp.render(sides, "celery beat", days, begin)

    _finish(conversion, output, show if compare else None, days)
