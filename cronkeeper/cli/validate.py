"""`cronkeeper validate PATH...`: every problem of the schedule files at once (SPEC §3).

Exit 0 when valid (warnings allowed), 1 when any error, 2 on usage errors (no path, a path
that does not exist). Database-free and fast: imports nothing but the spec and timing cores.
"""

from __future__ import annotations

import json
import os

import click

from cronkeeper import clock
from cronkeeper.cli.common import format_option
from cronkeeper.spec import LoadResult, load_paths, safe


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
@format_option
@click.pass_context
def validate_command(ctx: click.Context, paths: tuple[str, ...], fmt: str) -> None:
    """Check schedule files (files, or directories of *.toml) and report every problem."""
    if not paths:
        raise click.UsageError("give at least one schedule file or directory")
    missing = [p for p in paths if not os.path.lexists(p)]
    if missing:
        raise click.UsageError(
            "no such file or directory: " + ", ".join(safe(p) for p in missing)
        )
    result = load_paths(paths, now=clock.wall())
    click.echo(render_json(result) if fmt == "json" else render_text(result))
    ctx.exit(0 if result.valid else 1)
