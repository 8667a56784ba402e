"""A Celery app's beat schedule -> schedule entries (docs/import.md).

The app is imported as ``celery -A`` does (``module:attribute``; the current directory first on
``sys.path``), and its schedule read through ``app.conf.beat_schedule``, which is also where
Django's ``CELERY_BEAT_SCHEDULE`` lands when the app reads settings with ``namespace="CELERY"``.
The zone is Celery's own choice (``app.timezone``): the ``timezone`` setting, else UTC when
``enable_utc`` (the default), else the host's local time, which cannot be known for another host,
so ``--timezone`` must say it.

- ``crontab(...)`` -> ``cron``, every argument (``importing.celery_crontab`` says how, and
  which day_of_month/day_of_week pairs are refused).
- ``timedelta``, a number of seconds, or ``schedule(run_every=...)`` -> ``every`` (whole seconds).
  Celery counts an interval from beat's start (or the last run); cronkeeper's ``every`` is
  anchored to the Unix epoch: same interval, another phase (warned; ``--compare`` shows it).
- ``solar(...)`` and other schedule classes: refused (no cron or interval says "at sunset").
- ``kwargs`` -> ``payload``; positional ``args`` are bound to the task's parameter names when the
  task is registered in the app (else refused: the relay sends the payload as kwargs).
- ``options``: ``queue`` -> a route in a suggested relay config (docs/relay.md); ``expires``,
  ``priority`` and the rest have no place in a route or schedule: warned, kept in the notes.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import io
import json
import os
import sys
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from cronkeeper.importing import naming
from cronkeeper.importing.celery_crontab import crontab_cron
from cronkeeper.importing.model import Conversion, Entry, Problem, UnusableInput
from cronkeeper.timing import TimingError, load_zone

HEADER = (
    "Differences from Celery beat, for every schedule below:",
    "- each schedule emits a job whose task is the Celery task name and whose payload is its",
    "  kwargs; `cronkeeper relay` hands it to Celery (see the suggested relay config).",
    "- beat ran a task whenever it was due, even while the previous run was busy. cronkeeper",
    "  skips a period whose previous job is unfinished (overlap = \"skip\", the default) when",
    "  it can learn that a run finished: from the app's result backend. A task whose results",
    "  are not stored is written with overlap = \"allow\", beat's way (see its note).",
    "- beat forgot runs missed while it was down; `misfire` now decides, and `history` shows",
    "  every period's outcome.",
)


def load_app(spec: str) -> Any:
    """The Celery app named ``module:attribute`` (``module`` alone: its ``app`` or ``celery``)."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise UnusableInput(f"{spec!r}: give the app as MODULE:APP, e.g. proj.celery:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever the user's module raises (SystemExit too)
        raise UnusableInput(
            f"cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    names = [attr] if attr else ["app", "celery"]
    for name in names:
        app = getattr(module, name, None)
        if app is not None:
            break
    else:
        raise UnusableInput(f"module {module_name!r} has no attribute {' or '.join(map(repr, names))}")
    if not hasattr(app, "conf") or not hasattr(app, "tasks"):
        raise UnusableInput(f"{spec!r} is a {type(app).__name__}, not a Celery app")
    return app


def _zone(app: Any, fallback: str | None) -> str:
    try:
        name = app.conf.timezone
        enable_utc = app.conf.enable_utc
    except Exception as exc:  # noqa: BLE001 - the app's configuration failed to load
        raise UnusableInput(f"cannot read the app's configuration: {type(exc).__name__}: {exc}") from None
    if name:
        name = str(name)
        origin = "the app's timezone setting"
    elif enable_utc:
        return "UTC"
    elif fallback:
        name, origin = fallback, "--timezone"
    else:
        raise UnusableInput(
            "the app sets no timezone and enable_utc = False: Celery then uses the host's local "
            "time, which this command cannot know for the host beat ran on; pass --timezone ZONE"
        )
    try:
        load_zone(name)
    except TimingError as exc:
        raise UnusableInput(f"{origin} {name!r}: {exc}") from None
    return name


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _seconds(value: Any) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def _payload(app: Any, task: str, args: Any, kwargs: Any) -> tuple[dict | None, str | None]:
    kwargs = dict(kwargs or {})
    args = list(args or ())
    if args:
        registered = app.tasks.get(task) if hasattr(app.tasks, "get") else None
        if registered is None:
            return None, (
                f"positional args {args!r}: the relay sends the payload as keyword arguments, and "
                f"task {task!r} is not registered in the app, so its parameter names are unknown "
                "(import the task's module in the app, or give kwargs)"
            )
        try:
            bound = inspect.signature(registered.run).bind_partial(*args, **kwargs)
        except (TypeError, ValueError) as exc:
            return None, f"args {args!r} do not fit task {task!r}'s parameters: {exc}"
        for name, param in bound.signature.parameters.items():
            if name in bound.arguments and param.kind is inspect.Parameter.VAR_POSITIONAL:
                return None, (f"args {args!r}: task {task!r} takes *{name}, which keyword "
                              "arguments cannot fill")  # fmt: skip
        kwargs = dict(bound.arguments)
        for name, param in bound.signature.parameters.items():
            if param.kind is inspect.Parameter.VAR_KEYWORD and name in kwargs:
                kwargs.update(kwargs.pop(name))
    try:
        json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return None, f"kwargs are not JSON ({exc}): a payload is a JSON object"
    return kwargs, None


def convert(
    app: Any, *, source: str, misfire: str, owner: str | None, timezone: str | None,
    taken: Mapping[str, str] | None = None,
) -> Conversion:
    """Convert the app's beat schedule. Raises UnusableInput when it cannot be read at all.
    ``taken``: names other files of the output directory define (see :func:`naming.apart`)."""
    from celery.schedules import crontab, schedule, solar

    zone = _zone(app, timezone)
    try:
        beat = app.conf.beat_schedule or {}
    except Exception as exc:  # noqa: BLE001
        raise UnusableInput(f"cannot read beat_schedule: {type(exc).__name__}: {exc}") from None
    if not isinstance(beat, dict):
        raise UnusableInput(f"beat_schedule is a {type(beat).__name__}, not a dict of entries")
    problems: list[Problem] = []
    drafts: list[tuple[str, dict[str, Any]]] = []
    for key, item in beat.items():
        where = f"entry {key}"
        if not isinstance(item, dict) or "task" not in item or "schedule" not in item:
            problems.append(Problem(where, "not a beat entry (a dict with 'task' and 'schedule')"))
            continue
        draft, reasons = _draft(app, key, item, zone, crontab, schedule, solar)
        problems.extend(Problem(where, m, left_out=False) for m in reasons[1:])
        if draft is None:
            problems.append(Problem(where, reasons[0]))
            continue
        drafts.append((naming.slug(str(key)) or "job", draft))
    stem = stem_of(source)
    named = naming.apart([n for n, _ in drafts], stem, taken or {})
    entries = []
    for (name, why), (_, d) in zip(named, drafts, strict=True):
        if why:
            problems.append(Problem(f"entry {d['key']}", why, left_out=False))
        keys: list[tuple[str, Any]] = [(d["when"][0], d["when"][1]), ("timezone", zone),
                                       ("misfire", misfire), ("task", d["task"])]  # fmt: skip
        notes = d["notes"]
        if not _reports_completion(app, d["task"]):
            keys.insert(3, ("overlap", "allow"))
            notes = [*notes, _NO_COMPLETION]
        if d["payload"]:
            keys.append(("payload", d["payload"]))
        if owner:
            keys.append(("owner", owner))
        keys.append(("description", f"Celery beat entry {d['key']!r}"))
        entries.append(Entry(name=name, where=f"entry {d['key']}", keys=tuple(keys),
                             notes=tuple(notes), old=d["schedule"], queue=d["queue"]))  # fmt: skip
    return Conversion(
        source=source, header=(f"Converted by `cronkeeper import celery-beat` from {source}.",
                               *HEADER),
        entries=tuple(entries), problems=tuple(problems), stem=stem,
        extra_for=lambda kept: ((f"{stem}.relay.toml.example", _relay(source, kept)),),
    )  # fmt: skip


def stem_of(source: str) -> str:
    """The output file's name without .toml: ``proj.celery:app`` -> ``proj-celery-app``."""
    return naming.slug(source.replace(":", "-").replace(".", "-")) or "celery-beat"


_NO_COMPLETION = (
    'overlap = "allow", beat\'s way: no result is stored for this task (no result backend, or '
    'ignore_result), so "skip" would wait the job\'s timeout after each publication'
)


def _reports_completion(app: Any, task: str) -> bool:
    """Whether the relay can learn that a run of ``task`` finished: the app stores results (a
    result backend, and neither the task nor the app ignores them)."""
    try:
        backend = app.conf.result_backend
        ignore = bool(app.conf.task_ignore_result)
    except Exception:  # noqa: BLE001 - an unreadable configuration reports nothing
        return False
    if not backend or str(backend).split(":", 1)[0] == "disabled":
        return False
    registered = app.tasks.get(task) if hasattr(app.tasks, "get") else None
    if registered is not None:
        ignore = bool(getattr(registered, "ignore_result", ignore))
    return not ignore


def _draft(app, key, item, zone, crontab, schedule, solar) -> tuple[dict | None, list[str]]:
    """(draft, [reason left out or "", warnings...])."""
    task, sched = item["task"], item["schedule"]
    notes = [f"Celery beat entry {key!r}: task {task!r}, schedule {sched!r}"]
    warnings: list[str] = []
    if isinstance(sched, solar):
        return None, [f"solar schedule ({sched.event}): it fires at {sched.event} for a place, "
                      "which moves every day; no cron or interval can say that"]  # fmt: skip
    if isinstance(sched, crontab):
        cron, reason, warnings = crontab_cron(sched)
        if reason:
            return None, [reason]
        when = ("cron", cron)
    elif type(sched) is schedule or (  # a subclass may compute its own times: refused below
        isinstance(sched, timedelta | int | float) and not isinstance(sched, bool)
    ):
        relative = bool(item.get("relative")) or bool(getattr(sched, "relative", False))
        seconds = _seconds(sched.run_every if isinstance(sched, schedule) else sched)
        if seconds < 1 or seconds != int(seconds):
            return None, [f"interval of {seconds}s: cronkeeper's every is a whole number of "
                          "seconds, at least 1s"]  # fmt: skip
        when = ("every", _duration(int(seconds)))
        warnings.append(
            f"every {when[1]}: Celery counts it from beat's start"
            + (" rounded to the interval's unit (relative=True)" if relative else "")
            + "; cronkeeper's every is anchored to the Unix epoch, so the instants shift"
        )
        if not isinstance(sched, schedule):
            sched = schedule(run_every=timedelta(seconds=seconds), relative=relative, app=app)
    else:
        return None, [f"schedule {type(sched).__name__}: a custom schedule class; only crontab, "
                      "timedelta, a number of seconds and schedule() can be converted"]  # fmt: skip
    payload, reason = _payload(app, task, item.get("args"), item.get("kwargs"))
    if reason:
        return None, [reason]
    options = dict(item.get("options") or {})
    queue = options.pop("queue", None)
    if queue is not None:
        notes.append(f"Celery queue {queue!r}: routed by the suggested relay config")
    for option, v in sorted(options.items(), key=lambda kv: str(kv[0])):
        warnings.append(f"option {option}={v!r} has no place in a schedule or relay route; "
                        "not carried over")  # fmt: skip
        notes.append(f"Celery option {option}={v!r} was not carried over")
    if not getattr(sched, "_app", None):
        sched = copy.copy(sched)
        sched.app = app
    return {"key": key, "task": task, "when": when, "payload": payload, "notes": notes,
            "queue": queue, "schedule": sched}, ["", *warnings]  # fmt: skip


def _relay(source: str, entries: tuple[Entry, ...]) -> str:
    from cronkeeper.importing.render import string

    by_queue: dict[str | None, list[str]] = {}
    for entry in entries:
        by_queue.setdefault(entry.queue, []).append(entry.name)
    lines = [
        f"# A suggested relay config (docs/relay.md) for the schedules imported from {source}:",
        "# every imported schedule is a Celery task, so each is routed to the app's broker.",
        "# Check it with: cronkeeper validate --relay-config FILE",
        "",
        "[targets.celery]",
        'kind = "celery"',
        f"app = {string(source)}",
    ]
    for queue in sorted(by_queue, key=lambda q: (q is None, str(q))):
        lines += ["", "[[routes]]",
                  "schedules = [" + ", ".join(string(n) for n in by_queue[queue]) + "]",
                  'target = "celery"']  # fmt: skip
        if queue is not None:
            lines.append(f"queue = {string(str(queue))}")
    return "\n".join(lines) + "\n"


MAX_CHECKS = 200_000  # is_due calls per entry; a faster schedule is compared over a shorter span


def beat_fires(
    sched: Any, zone: str, start: datetime, end: datetime
) -> tuple[list[int], datetime]:
    """When Celery beat, started at ``start``, runs an entry: its own ``is_due`` on a simulated
    clock. Beat sleeps until the next check ``is_due`` asks for (its max loop interval only adds
    checks that change nothing, since each check recomputes from the last run). Returns the fires
    and the instant the simulation reached (``end``, or earlier after :data:`MAX_CHECKS`).

    Beat reads the schedule in ``zone``, the zone it was written in (the app's, or --timezone for
    an app on the host's local time), never in this process's local zone: an app with
    ``enable_utc = False`` and no ``timezone`` would otherwise be simulated in the importing
    host's zone (its ``app.timezone`` is the local time of whoever runs the import)."""
    from celery.utils.time import timezone as celery_zones

    s = copy.copy(sched)
    s.tz = celery_zones.get_timezone(zone)  # the schedule's zone (a cached property of Celery's)
    clock = [start]
    s.nowfun = lambda: clock[0]
    last = start
    out: list[int] = []
    for _ in range(MAX_CHECKS):
        due, next_in = s.is_due(last)
        if due:
            out.append(round(clock[0].timestamp()))
            last = clock[0]
        clock[0] = clock[0] + timedelta(seconds=max(float(next_in), 0.001))
        if clock[0] > end:
            return out, end
    reached = datetime.fromtimestamp(out[-1], start.tzinfo) if out else start
    return out, reached
