"""`cronkeeper schedules list|show|put|delete` and `next NAME` without --schedules: every
schedule the database knows, file or runtime, and the runtime ones changed from a file
(docs/runtime-schedules.md). Plain functions returning values; cli/ renders them."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cronkeeper import clock
from cronkeeper import schedules as api
from cronkeeper.db.engine import Engine, translate_errors
from cronkeeper.db.runtime_schedules import runtime_list
from cronkeeper.db.schedule_controls import controls_paused
from cronkeeper.db.schedule_versions import versions_all, versions_in_force
from cronkeeper.errors import CronkeeperError, ScheduleError, UsageError
from cronkeeper.schedule.lines import LineIndex
from cronkeeper.schedule.model import ScheduleSpec, read_stored_version
from cronkeeper.schedule.rules import KEYS
from cronkeeper.schedule.runtime import check_specs
from cronkeeper.versions import RUNTIME_ORIGIN

SOURCES = ("file", "runtime")


def listing(engine: Engine, source: str | None = None) -> list[dict[str, Any]]:
    """Every schedule: the file schedules the leader has in force, and every live runtime
    schedule (adopted or not yet), as ``schedules list --format json`` prints them:
    ``{"name", "source", "version_id", "spec", "updated_at", "paused"}`` (a file schedule's
    spec is its stored version; its updated_at when that version took over), by name."""
    with translate_errors("listing schedules"), engine.connect() as conn:
        runtime = {r.name: r for r in runtime_list(conn, None)}
        files = [v for v in versions_in_force(conn)
                 if v.spec is not None and v.origin != RUNTIME_ORIGIN and v.schedule not in runtime]
        paused = controls_paused(conn)
        conn.rollback()
    items = []
    if source in (None, "file"):
        items += [{"name": v.schedule, "source": "file", "version_id": v.id, "spec": v.spec,
                   "updated_at": _iso(v.active_from), "paused": v.schedule in paused,
                   "file": (v.origin or "").removeprefix("file:") or None} for v in files]
    if source in (None, "runtime"):
        items += [{"name": r.name, "source": "runtime", "version_id": r.version_id,
                   "spec": r.spec, "updated_at": _iso(r.updated_at), "paused": r.name in paused}
                  for r in runtime.values()]
    return sorted(items, key=lambda item: item["name"])


def show(engine: Engine, name: str) -> dict[str, Any]:
    """One schedule of ``listing``; CronkeeperError when there is none."""
    found = [item for item in listing(engine) if item["name"] == name]
    if not found:
        raise CronkeeperError(f"no schedule named {name!r} (neither a file schedule the leader "
                              "has adopted nor a runtime schedule)")
    return found[0]


def put_from_file(engine: Engine, schema: str, name: str, path: str) -> tuple[int, bool]:
    """Put the runtime schedule ``name`` from a TOML file holding one schedule table, with or
    without its ``[NAME]`` header; validated like the API, problems with file and line.
    Returns (version id, whether anything changed)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the file: {exc}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScheduleError(f"{path}: invalid TOML: {exc}") from None
    index = LineIndex(text)
    headed = len(doc) == 1 and name in doc and isinstance(doc[name], dict)
    table = doc[name] if headed else doc
    tables = [k for k, v in doc.items() if isinstance(v, dict) and k not in KEYS]
    if not headed and tables and len(tables) == len(doc):  # only headers, and not NAME's alone
        if len(tables) == 1:
            raise ScheduleError(f"{path}:{index.line(tables[0])}: the file's table is "
                                f"[{tables[0]}], not [{name}]: name the header [{name}], or "
                                "remove it")
        raise ScheduleError(f"{path}: the file holds {len(tables)} tables ("
                            + ", ".join(f"[{t}]" for t in tables)
                            + "); `schedules put` takes one schedule's")

    def line_of(schedule: str) -> Callable[..., int]:
        return lambda *keys: index.line(schedule, *keys) if headed else index.line(*keys)

    with translate_errors("writing the runtime schedule"), engine.begin() as conn:
        known = api.calendars_for(conn, {name: table}, schema)
        check_specs({name: table}, now=clock.wall(), file=path, line_of=line_of,
                    calendars=known)  # its problems with file and line
        before = runtime_list(conn, None, names=[name])
        version = api.put(conn, name, table, schema=schema)
    return version, not before or before[0].version_id != version


def delete(engine: Engine, schema: str, name: str) -> bool:
    """Delete the runtime schedule ``name`` (False: there is none); a file schedule's name is
    refused (ScheduleError naming its file)."""
    with translate_errors("deleting the runtime schedule"), engine.begin() as conn:
        return api.delete(conn, name, schema=schema)


def stored_spec(engine: Engine, name: str) -> ScheduleSpec | None:
    """The spec of ``name`` as the database holds it: the runtime schedule's (adopted or not
    yet), else the version the leader has in force; None when neither (or it was removed)."""
    with translate_errors("reading the schedule"), engine.connect() as conn:
        rows = runtime_list(conn, None, names=[name])
        versions = versions_all(conn, [name]) if not rows else []  # oldest first
        conn.rollback()
    if rows:
        return read_stored_version(name, rows[0].version_id, rows[0].canonical)[0]
    if versions and versions[-1][2] is not None:
        return read_stored_version(name, versions[-1][0], versions[-1][2])[0]
    return None


def _iso(value: Any) -> Any:
    return value.isoformat().replace("+00:00", "Z") if hasattr(value, "isoformat") else value
