"""``cronkeeper.schedules``: schedules defined at runtime, in the application's own transaction
(SPEC §15; docs/runtime-schedules.md).

Every function takes a SQLAlchemy ``Connection`` or a psycopg 3 ``Connection`` and runs in the
caller's transaction, as ``cronkeeper.enqueue`` does: the change exists if and only if the
caller commits, and the leader adopts it within a second of the commit (a notification sent at
commit wakes it; it also looks every second). Specs are mappings with exactly the keys of a
schedule table in a file (durations as the same strings, ``"10m"``), validated by the rules and
messages of ``cronkeeper validate``; invalid input raises :class:`cronkeeper.ScheduleError`,
whose ``.problems`` lists every problem of every spec, before anything is written. ``command``
is refused (argv comes only from files on the workers). Names are one namespace with the
schedule files: a name a file schedule holds is refused, naming its file.

    with engine.begin() as conn:
        tenant_id = create_tenant(conn, ...)
        cronkeeper.schedules.put(conn, f"tenant-{tenant_id}.report", {
            "cron": "H 6 * * *", "timezone": "Europe/Berlin", "misfire": "latest",
            "task": "reports.daily", "payload": {"tenant": tenant_id}, "owner": "team-reports",
        })
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from datetime import date
from typing import Any

from cronkeeper import clock
from cronkeeper.db import runtime_schedules as db
from cronkeeper.db.calendars import calendars_named
from cronkeeper.db.schedule_versions import versions_file_held
from cronkeeper.errors import UsageError
from cronkeeper.schedule.diagnostics import Diagnostic
from cronkeeper.schedule.runtime import RUNTIME, check_specs, schedule_error
from cronkeeper.timing.calendars import Calendar

__all__ = ["delete", "get", "list", "put", "put_many", "sync"]


def put(connection: Any, name: str, spec: Mapping[str, Any], *,
        schema: str = "cronkeeper") -> int:
    """Create or replace the runtime schedule ``name``; return its version's id. A put whose
    spec equals the stored one writes nothing and returns the current id."""
    return put_many(connection, {name: spec}, schema=schema)[name]


def put_many(connection: Any, specs: Mapping[str, Mapping[str, Any]], *,
             schema: str = "cronkeeper") -> dict[str, int]:
    """``put`` for every item of ``specs`` ({name: spec}), one statement for the whole mapping,
    all or nothing; return {name: version id}."""
    return _put(connection, specs, schema, "put_many")


def sync(connection: Any, specs: Mapping[str, Mapping[str, Any]], *, prefix: str,
         schema: str = "cronkeeper") -> dict[str, int]:
    """Make the runtime schedules whose names start with ``prefix`` exactly ``specs``: put
    what is new or changed, delete what is absent; all or nothing. Every name of ``specs``
    must start with ``prefix``. Returns {name: version id} of ``specs``."""
    if not isinstance(prefix, str) or not prefix:
        raise UsageError("sync: prefix must be a non-empty string (the names this code owns)")
    _mapping("sync", specs)
    outside = sorted(str(n) for n in specs if not (isinstance(n, str) and n.startswith(prefix)))
    if outside:
        raise schedule_error([Diagnostic(RUNTIME, 0, n, f"the name does not start with the "
                                         f"prefix '{prefix}' being synced") for n in outside])
    ids = _put(connection, specs, schema, "sync", prefix=prefix)
    db.runtime_delete(connection, schema, [], "sync: deleting runtime schedules", prefix=prefix,
                      keep=builtins.list(specs))
    return ids


def delete(connection: Any, name: str, *, schema: str = "cronkeeper") -> bool:
    """Delete the runtime schedule ``name``; False when there is none. Fenced: no period later
    than this transaction's commit is emitted, even by a leader that has not adopted it yet.
    Jobs already emitted are untouched. A file schedule's name is refused (ScheduleError)."""
    if not isinstance(name, str):
        raise UsageError(f"delete: name must be a string, not {type(name).__name__}")
    deleted = db.runtime_delete(connection, schema, [name], "delete: deleting a runtime schedule")
    if deleted:
        return True
    held = versions_file_held(connection, [name], schema)
    if held:
        raise schedule_error([_held(name, held[name])])
    return False


def get(connection: Any, name: str, *, schema: str = "cronkeeper") -> dict[str, Any] | None:
    """The spec of the runtime schedule ``name`` as it was put, or None."""
    if not isinstance(name, str):
        raise UsageError(f"get: name must be a string, not {type(name).__name__}")
    rows = db.runtime_list(connection, schema, names=[name])
    return rows[0].spec if rows else None


def list(connection: Any, prefix: str | None = None, *,  # noqa: A001 - SPEC §15's name
         schema: str = "cronkeeper") -> dict[str, dict[str, Any]]:
    """{name: spec} of the runtime schedules (those whose name starts with ``prefix``)."""
    if prefix is not None and not isinstance(prefix, str):
        raise UsageError(f"list: prefix must be a string, not {type(prefix).__name__}")
    return {row.name: row.spec for row in db.runtime_list(connection, schema, prefix=prefix)}


def _put(connection: Any, specs: Mapping[str, Mapping[str, Any]], schema: str,
         what: str, prefix: str | None = None) -> dict[str, int]:
    _mapping(what, specs)
    checked = check_specs(specs, now=clock.wall(), calendars=calendars_for(connection, specs,
                                                                              schema))
    names = [c.spec.name for c in checked]
    held = versions_file_held(connection, names, schema) if names else {}
    if held:
        raise schedule_error([_held(n, origin) for n, origin in sorted(held.items())])
    rows = [(c.spec.name, c.given, c.canonical, c.digest) for c in checked]
    written = db.runtime_write(connection, schema, rows, f"{what}: writing runtime schedules",
                               prefix=prefix)  # (a sync: its deletes locked in the same order)
    return {name: written[name][0] for name in names}


def calendars_for(connection: Any, specs: Mapping[Any, Any], schema: str
                  ) -> dict[str, tuple[Calendar, str | None]]:
    """The calendars the leader recorded from the files, when a spec names one (else none is
    read): {name: (calendar, its file)}."""
    if not any(isinstance(t, Mapping) and "calendar" in t for t in specs.values()):
        return {}
    found = calendars_named(connection, schema, [])
    out = {}
    for name, (dates, origin) in found.items():
        try:
            out[name] = (Calendar.of(name, [date.fromisoformat(d) for d in dates]),
                         (origin or "").removeprefix("file:") or None)
        except (TypeError, ValueError):  # a row written by hand: as if it were not there
            continue
    return out


def _mapping(what: str, specs: Any) -> None:
    if not isinstance(specs, Mapping):
        raise UsageError(f"{what}: specs must be a mapping {{name: spec}}, "
                         f"not {type(specs).__name__}")


def _held(name: str, origin: str) -> Diagnostic:
    """The problem of a name a file schedule holds, naming the file."""
    where = origin.removeprefix("file:") if origin.startswith("file:") else "the schedule files"
    return Diagnostic(RUNTIME, 0, name, f"the name is held by a file schedule ({where}); names "
                      "are one namespace across files and runtime: choose another name, or "
                      "remove it from the files first")
