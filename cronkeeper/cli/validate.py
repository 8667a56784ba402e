"""`cronkeeper validate PATH...`: every problem of the schedule files at once (docs/schedules.md).

Exit 0 when valid (warnings allowed), 1 when any error, 2 on usage errors (no path, a path
that does not exist). Database-free and fast: imports nothing but the spec and timing cores.
"""

from __future__ import annotations

import gc
import json
import os

import click

from cronkeeper import clock
from cronkeeper.cli.common import format_option
from cronkeeper.schedule import LoadResult, load_paths, safe


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def summary(result: LoadResult) -> str:
    """``3 schedules in 2 files: 2 errors, 1 warning``."""
    return (
        f"{_plural(result.defined, 'schedule')} in {_plural(len(result.files), 'file')}: "
        f"{_plural(len(result.errors), 'error')}, {_plural(len(result.warnings), 'warning')}"
    )


def render_text(result: LoadResult) -> str:
    lines = [f"{d.severity}: {d.render()}" for d in result.diagnostics]
    lines.append(summary(result))
    return "\n".join(lines)


def render_json(result: LoadResult) -> str:
    return json.dumps(
        {
            "valid": result.valid,
            "schedules": result.defined,
            "errors": [d.to_json() for d in result.errors],
            "warnings": [d.to_json() for d in result.warnings],
        },
        indent=2,
    )


@click.command("validate")
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option("--relay-config", "relay_config", default=None, metavar="FILE",
              help="Also check a relay config (schedule PATHs are then optional; given, routes "
                   "are checked against their schedules).")
@click.option("--notify-config", "notify_config", default=None, metavar="FILE",
              help="Also check a notify config (docs/notifications.md; schedule PATHs are then "
                   "optional).")
@format_option
@click.pass_context
def validate_command(
    ctx: click.Context, paths: tuple[str, ...], relay_config: str | None,
    notify_config: str | None, fmt: str
) -> None:
    """Check schedule files (files, or directories of *.toml) and report every problem."""
    if not paths and relay_config is None and notify_config is None:
        raise click.UsageError("give at least one schedule file or directory")
    for option, given in (("--relay-config", relay_config), ("--notify-config", notify_config)):
        if given is not None and not os.path.isfile(given):
            raise click.UsageError(f"{option}: no such file: {safe(given)}")
    missing = [p for p in paths if not os.path.lexists(p)]
    if missing:
        raise click.UsageError(
            "no such file or directory: " + ", ".join(safe(p) for p in missing)
        )
    # A short process that makes no reference cycles: the collector would only walk, at the
    # end of loading, the half a million objects 100,000 schedules leave (0.2 s of CPU).
    gc.disable()
    # The specs themselves are wanted only to check a relay config's routes against them.
    result = (
        load_paths(paths, now=clock.wall(), keep_specs=relay_config is not None)
        if paths
        else _empty()
    )
    if relay_config is not None:
        result = _with_relay_config(result, relay_config, bool(paths))
    if notify_config is not None:
        result = _with_notify_config(result, notify_config)
    click.echo(render_json(result) if fmt == "json" else render_text(result))
    ctx.exit(0 if result.valid else 1)


def _empty() -> LoadResult:
    from cronkeeper.schedule.model import ScheduleSet

    return LoadResult(ScheduleSet(()), [], [])


def _with_notify_config(result: LoadResult, path: str) -> LoadResult:
    """The result so far plus the notify config's diagnostics; the environment variables it
    names that are unset here, and an Apprise sink without the extra, are warnings (the
    processes that send are where they must be)."""
    import importlib.util

    from cronkeeper.notify.config import environment_problems, load_notify_config
    from cronkeeper.notify.model import SinkKind
    from cronkeeper.schedule.diagnostics import Diagnostic, Severity

    checked = load_notify_config(path)
    found = list(checked.diagnostics)
    if checked.config is not None:
        found += [Diagnostic(path, 0, None, f"{problem} here (the processes that send "
                             "notifications need it)", Severity.WARNING)
                  for problem in environment_problems(checked.config, os.environ)]
        if any(s.kind is SinkKind.APPRISE for s in checked.config.sinks) and \
                importlib.util.find_spec("apprise") is None:
            found.append(Diagnostic(path, 0, None, "an apprise sink needs the apprise extra: "
                                    "pip install 'cronkeeper[apprise]'", Severity.WARNING))
    return _merged(result, path, found)


def _merged(result: LoadResult, path: str, found: list) -> LoadResult:
    import dataclasses

    return dataclasses.replace(
        result,
        errors=result.errors + [d for d in found if d.severity == "error"],
        warnings=result.warnings + [d for d in found if d.severity == "warning"],
        files=(*result.files, path),
        diagnostics=[*result.diagnostics, *found],
    )


def _with_relay_config(result: LoadResult, path: str, with_schedules: bool) -> LoadResult:
    """The schedule files' result plus the relay config's diagnostics (docs/relay.md)."""

    from cronkeeper.relay.config import check_against_schedules, load_relay_config

    checked = load_relay_config(path)
    found = list(checked.diagnostics)
    if checked.config is not None and with_schedules:
        found += check_against_schedules(checked.config, result.schedules.by_name(), path)
    return _merged(result, path, found)
