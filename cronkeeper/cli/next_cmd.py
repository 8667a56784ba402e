"""`cronkeeper next NAME [--schedules DIR]`: the next fire instants of one schedule (docs/schedules.md).

Prints each fire local (with its offset) and in UTC, so anyone can check DST behaviour before
it happens; a cron with ``H`` first says what it resolves to for this schedule's name. With a
calendar, the periods on its listed dates are listed too, marked skipped, and a fire that
``on_calendar = "next_day"`` moved says from which date. Exit 1 when the schedule files have errors or NAME is unknown, 2 on usage errors.
With --schedules, database-free: imports only the spec and timing cores. Without it, the schedule
is read from the database (a runtime schedule, or the version in force of a file schedule).
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
from cronkeeper.planning import CalendarMark, calendar_mark
from cronkeeper.schedule import ScheduleSpec, load_paths
from cronkeeper.timing import instants, load_zone, parse_instant


def _after_option(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None


Fire = tuple[datetime, datetime, CalendarMark | None]


def next_fires(spec: ScheduleSpec, after: datetime, count: int) -> list[Fire]:
    """(UTC instant, local time in the schedule's zone, how it stands to the calendar) of the
    next ``count`` periods: a period a calendar skips counts, and is marked so."""
    trigger = spec.trigger()
    tz = load_zone(spec.timezone)
    return [(t, t.astimezone(tz), calendar_mark(spec, trigger, t))
            for t in islice(trigger.fires(after, instants.END), count)]


def calendar_note(spec: ScheduleSpec) -> str | None:
    """The calendar a schedule names, in a line: its name, policy and last date."""
    calendar = spec.calendar
    if calendar is None:
        return None
    last = calendar.last_date()
    return (f"# calendar '{safe(calendar.name)}' (on_calendar = {spec.on_calendar}): "
            f"{len(calendar.days)} date{'s' if len(calendar.days) != 1 else ''}, the last {last}")


def utc_text(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hashed_note(spec: ScheduleSpec) -> str | None:
    """What a cron's ``H`` resolves to for this schedule, or None when it has none."""
    resolved = spec.resolved_cron
    if resolved is None or resolved == spec.cron:
        return None
    return f"# cron '{safe(spec.cron)}' is '{safe(resolved)}' for '{safe(spec.name)}' (H hashes the name)"


def render_table(spec: ScheduleSpec, fires: list[Fire], count: int) -> str:
    lines = [note for note in (hashed_note(spec), calendar_note(spec)) if note]
    lines += [
        f"{local.isoformat()}  {safe(local.tzname())}  {utc_text(utc)}"
        + (f"  {safe(mark.text)}" if mark else "")
        for utc, local, mark in fires
    ]
    if len(fires) < count:
        lines.append(
            f"schedule '{safe(spec.name)}' has no {'' if not fires else 'further '}fire before "
            f"{utc_text(instants.END)}, where the range cronkeeper computes ends"
        )
    return "\n".join(lines)


def fire_json(utc: datetime, local: datetime, mark: CalendarMark | None) -> dict[str, object]:
    """One fire: ``utc`` and ``local``; ``"skipped": "calendar"`` on a date the calendar lists;
    ``"moved_from": ["YYYY-MM-DD", ...]`` for a fire ``next_day`` moved from listed dates."""
    item: dict[str, object] = {"utc": utc_text(utc), "local": local.isoformat()}
    if mark is not None:
        item.update({"skipped": "calendar"} if mark.kind == "skipped"
                    else {"moved_from": [d.isoformat() for d in mark.days]})
    return item


def render_json(spec: ScheduleSpec, fires: list[Fire]) -> str:
    document: dict[str, object] = {
        "schedule": spec.name,
        "timezone": spec.timezone,
        "fires": [fire_json(*fire) for fire in fires],
    }
    if spec.resolved_cron != spec.cron:  # H: say what it resolved to
        document["cron"], document["resolved_cron"] = spec.cron, spec.resolved_cron
    if spec.calendar is not None:
        last = spec.calendar.last_date()
        document["calendar"] = {"name": spec.calendar.name, "on_calendar": str(spec.on_calendar),
                                "dates": len(spec.calendar.days),
                                "last_date": last.isoformat() if last else None}
    return json.dumps(document, indent=2)


@click.command("next")
@click.argument("name")
@click.option(
    "--schedules",
    "directory",
    default=None,
    type=click.Path(exists=True, path_type=str),
    help="Directory (or file) of schedule TOML files. Without it: the schedule as the database "
         "holds it (a runtime schedule, or a file schedule's version in force).",
)
@click.option("--database-url", envvar="CRONKEEPER_DATABASE_URL", default=None,
              help="Without --schedules: postgresql:// URL (env CRONKEEPER_DATABASE_URL).")
@click.option("--schema", envvar="CRONKEEPER_SCHEMA", default="cronkeeper", show_default=True,
              help="Without --schedules: the schema (env CRONKEEPER_SCHEMA).")
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
def next_command(name: str, directory: str | None, database_url: str | None, schema: str,
                 count: int, after: datetime | None, fmt: str) -> None:
    """Print the next fire instants of schedule NAME, local and UTC."""
    now = clock.wall()
    spec = _from_files(name, directory, now) if directory else _from_database(
        name, database_url, schema)
    fires = next_fires(spec, after if after is not None else now, count)
    click.echo(render_json(spec, fires) if fmt == "json" else render_table(spec, fires, count))


def _from_database(name: str, database_url: str | None, schema: str) -> ScheduleSpec:
    from cronkeeper.cli.connect import open_database  # noqa: PLC0415 - only without --schedules
    from cronkeeper.operations.schedules import stored_spec  # noqa: PLC0415

    db = open_database(database_url, schema)
    spec = stored_spec(db.engine, name)
    if spec is None:
        raise CronkeeperError(f"no schedule named '{safe(name)}' in the database (a runtime "
                              "schedule, or a file schedule a leader adopted); give --schedules "
                              "DIR to read schedule files")
    return spec


def _from_files(name: str, directory: str, now: datetime) -> ScheduleSpec:
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
    return spec
