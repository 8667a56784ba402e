"""`cronkeeper next NAME --schedules DIR`: the next fire instants of one schedule (docs/schedules.md).

Prints each fire local (with its offset) and in UTC, so anyone can check DST behaviour before
it happens; a cron with ``H`` first says what it resolves to for this schedule's name. Exit 1 when the schedule files have errors or NAME is unknown, 2 on usage errors.
Database-free: imports only the spec and timing cores.
"""

from __future__ import annotations

import difflib
import json
from datetime import UTC, datetime
from itertools import islice

import click

from cronkeeper import clock
from cronkeeper.cli.common import format_option, safe
from cronkeeper.errors import CronkeeperError
from cronkeeper.schedule import ScheduleSpec, load_paths
from cronkeeper.timing import instants, load_zone, parse_instant


def _after_option(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


def next_fires(spec: ScheduleSpec, after: datetime, count: int) -> list[tuple[datetime, datetime]]:
    """(UTC instant, local time in the schedule's zone) of the next ``count`` fires."""
    trigger = spec.trigger()
    tz = load_zone(spec.timezone)
    return [(t, t.astimezone(tz)) for t in islice(trigger.fires(after, instants.END), count)]


def utc_text(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hashed_note(spec: ScheduleSpec) -> str | None:
    """What a cron's ``H`` resolves to for this schedule, or None when it has none."""
    resolved = spec.resolved_cron
    if resolved is None or resolved == spec.cron:
        return None
    return f"# cron '{safe(spec.cron)}' is '{safe(resolved)}' for '{safe(spec.name)}' (H hashes the name)"


def render_table(spec: ScheduleSpec, fires: list[tuple[datetime, datetime]], count: int) -> str:
    note = hashed_note(spec)
    lines = [note] if note else []
    lines += [
        f"{local.isoformat()}  {safe(local.tzname())}  {utc_text(utc)}" for utc, local in fires
    ]
    if len(fires) < count:
        lines.append(
            f"schedule '{safe(spec.name)}' has no {'' if not fires else 'further '}fire before "
            f"{utc_text(instants.END)}, where the range cronkeeper computes ends"
        )
    return "\n".join(lines)


def render_json(spec: ScheduleSpec, fires: list[tuple[datetime, datetime]]) -> str:
    document: dict[str, object] = {
        "schedule": spec.name,
        "timezone": spec.timezone,
        "fires": [{"utc": utc_text(utc), "local": local.isoformat()} for utc, local in fires],
    }
    if spec.resolved_cron != spec.cron:  # H: say what it resolved to
        document["cron"], document["resolved_cron"] = spec.cron, spec.resolved_cron
    return json.dumps(document, indent=2)


@click.command("next")
@click.argument("name")
@click.option(
    "--schedules",
    "directory",
    required=True,
    type=click.Path(exists=True, path_type=str),
    help="Directory (or file) of schedule TOML files.",
)
@click.option(
    "-n",
    "count",
    type=click.IntRange(1, 100_000),
    default=5,
    show_default=True,
    help="How many fires to list.",
)
@click.option(
    "--after",
    callback=_after_option,
    metavar="ISO",
    help="List fires strictly after this instant (ISO 8601 with an offset or Z). Default: now.",
)
@format_option
def next_command(name: str, directory: str, count: int, after: datetime | None, fmt: str) -> None:
    """Print the next fire instants of schedule NAME, local and UTC."""
    now = clock.wall()
    result = load_paths([directory], now=now)
    if not result.valid:
        for diagnostic in result.errors:
            click.echo(diagnostic.render(), err=True)
        raise CronkeeperError(
            f"{len(result.errors)} error(s) in the schedule files; fix them first "
            f"(cronkeeper validate {safe(directory)})"
        )
    schedules = result.schedules.by_name()
    spec = schedules.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, list(schedules), n=1)
        hint = f"; did you mean '{safe(close[0])}'?" if close else ""
        raise CronkeeperError(f"no schedule named '{safe(name)}' in {safe(directory)}{hint}")
    fires = next_fires(spec, after if after is not None else now, count)
    click.echo(render_json(spec, fires) if fmt == "json" else render_table(spec, fires, count))
