"""Dead letters: which a filter selects, their JSON documents (``dlq list|show --format json``
and the web's ``/api/dlq`` are the same), a page of them with the whole selection's count, and
replay or discard of exactly the ones confirmed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from cronkeeper.db import attempts as db_attempts
from cronkeeper.db import outbox as db_outbox
from cronkeeper.db.engine import Engine, translate_errors
from cronkeeper.db.outbox import DeadFilter, DeadSelection
from cronkeeper.errors import UsageError
from cronkeeper.operations.output import attempt_view
from cronkeeper.timing.durations import parse_duration

# The most dead letters one list (``dlq list``, ``/api/dlq``) holds: 100,000 with errors of a
# few KB are hundreds of MB of JSON and about a GB in the process that builds it.
MAX_DOCUMENT = 100_000


def _age(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return parse_duration(text)
    except Exception as exc:  # noqa: BLE001 - a usage error, with the parser's message
        raise UsageError(f"invalid age {text!r}: {exc}") from None


def choose(engine: Engine, schedule: str | None, task: str | None, older_than: str | None,
           newer_than: str | None, ids: list[int] | None = None) -> DeadFilter:
    """A filter with its ages (durations such as ``2h``) made instants by the database's now."""
    older, newer = _age(older_than), _age(newer_than)
    now = None
    if older is not None or newer is not None:
        with translate_errors("reading dead letters"), engine.connect() as conn:
            now = conn.exec_driver_sql("SELECT now()").scalar_one()
    return DeadFilter(schedule, task, _ago(now, older, older_than), _ago(now, newer, newer_than),
                      None if ids is None else tuple(ids))


def select_dead(engine: Engine, schedule: str | None, task: str | None, older_than: str | None,
                newer_than: str | None, ids: list[int] | None = None) -> list[dict]:
    """The dead letters a filter selects (ages as durations such as ``2h``), oldest first, at
    most ``MAX_DOCUMENT`` of them (``dlq show`` and the web's pages of one dead letter)."""
    return selected(engine, choose(engine, schedule, task, older_than, newer_than, ids))


def listing(engine: Engine, chosen: DeadFilter, limit: int | None = None,
            offset: int = 0) -> list[dict]:
    """``dlq list`` and ``/api/dlq``: the whole selection from the ``offset``-th, or ``limit``
    of it. A whole selection past ``MAX_DOCUMENT`` is refused, saying how many there are,
    rather than cut short without a word."""
    if limit is None:
        with translate_errors("counting dead letters"), engine.connect() as conn:
            total = sum(db_outbox.outbox_dead_tasks(conn, chosen).values())
        if total - offset > MAX_DOCUMENT:
            raise UsageError(
                f"the filter selects {total} dead letters, more than the {MAX_DOCUMENT} one "
                "list holds: narrow it (schedule, task, age) or ask for a page (limit and "
                "offset)")
        limit = MAX_DOCUMENT
    return selected(engine, chosen, limit, offset)


def selected(engine: Engine, chosen: DeadFilter, limit: int = MAX_DOCUMENT,
             offset: int = 0) -> list[dict]:
    """A filter's dead letters, oldest first, ``limit`` of them from the ``offset``-th."""
    with translate_errors("reading dead letters"), engine.connect() as conn:
        return db_outbox.outbox_dead_list(conn, chosen, limit=limit, offset=offset)


def dead_page(engine: Engine, chosen: DeadFilter, page: int,
              per_page: int) -> tuple[list[dict], dict[str, int]]:
    """One page of a filter's dead letters (oldest first), and the whole selection's count per
    task: what the web's ``/dlq`` shows, reading no more rows than it shows."""
    with translate_errors("counting dead letters"), engine.connect() as conn:
        tasks = db_outbox.outbox_dead_tasks(conn, chosen)
    return selected(engine, chosen, per_page, (page - 1) * per_page), tasks


def _ago(now: datetime | None, seconds: float | None, text: str | None) -> datetime | None:
    if seconds is None or now is None:
        return None
    try:
        return now - timedelta(seconds=seconds)
    except OverflowError:  # timedelta or datetime out of range
        raise UsageError(f"invalid age {text!r}: it reaches back before year 1") from None


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def list_document(rows: list[dict]) -> list[dict[str, Any]]:
    """``dlq list --format json``: the web's ``/api/dlq`` is the same document."""
    return [_item(r) for r in rows]


def show_document(engine: Engine, row: dict) -> dict[str, Any]:
    """``dlq show --format json``: one dead letter with every attempt (each with its output's
    size and last lines; ``last_error`` ends with the tail of the last attempt's output)."""
    with translate_errors("reading the dead letter's attempts"), engine.connect() as conn:
        attempts = db_attempts.attempts_for_job(conn, row["id"])
    return {**_item(row), "payload": row["payload"], "owner": row["owner"],
            "max_attempts": row["max_attempts"], "scheduled_for": iso(row["scheduled_for"]),
            "created_at": iso(row["created_at"]),
            "attempt_log": [{**attempt_view(a), "started_at": iso(a["started_at"]),
                             "finished_at": iso(a["finished_at"])} for a in attempts]}


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2)


def selection(engine: Engine, chosen: DeadFilter) -> DeadSelection:
    """The whole of a filter's selection: ids and count per task, no row's text (what ``dlq
    replay`` and ``discard`` state and act on, however many)."""
    with translate_errors("reading dead letters"), engine.connect() as conn:
        return db_outbox.outbox_dead_selection(conn, chosen)


def apply(engine: Engine, verb: str, ids: list[int]) -> list[int]:
    """Replay or discard exactly these dead letters (those still dead); returns the ids done."""
    with translate_errors(f"{verb} of dead letters"), engine.begin() as conn:
        return _act(conn, verb, ids)


def _act(conn: Any, verb: str, ids: list[int]) -> list[int]:
    """Replay (its attempts archived first) or discard these dead letters, in ``conn``'s
    transaction; the ids done."""
    if verb == "replay":
        db_attempts.attempts_archive(conn, ids)
        return db_outbox.outbox_dead_replay(conn, ids)
    return db_outbox.outbox_dead_discard(conn, ids)


class Verdict(StrEnum):
    DONE = "done"
    CHANGED = "changed"  # the selection is not the one confirmed: nothing done
    WRONG_COUNT = "wrong_count"  # the operator typed another number: nothing done


@dataclass(frozen=True, slots=True)
class Confirmation:
    """What a confirmation page states: the whole selection, the first of its rows, and the
    digest the act must find again."""
    selection: DeadSelection
    sample: list[dict]
    digest: str


def confirm_digest(verb: str, chosen: DeadFilter, selection: DeadSelection) -> str:
    """The verb, the filter and the database's digest of every selected row (ids, attempts,
    dead-at instants, errors): a job replayed, discarded, dead again or newly dead under the
    filter changes it."""
    text = "|".join([verb, chosen.schedule or "", chosen.task or "", iso(chosen.dead_before) or "",
                     iso(chosen.dead_after) or "", ",".join(map(str, chosen.ids or ())),
                     selection.digest])
    return hashlib.sha256(text.encode()).hexdigest()


def confirmation(engine: Engine, verb: str, chosen: DeadFilter, sample: int) -> Confirmation:
    whole = selection(engine, chosen)
    return Confirmation(whole, selected(engine, chosen, sample) if whole.ids else [],
                        confirm_digest(verb, chosen, whole))


def apply_confirmed(engine: Engine, verb: str, chosen: DeadFilter, digest: str,
                    typed: str) -> tuple[Verdict, DeadSelection, list[int]]:
    """Replay or discard a filter's whole selection if it is still the one confirmed (its
    digest) and ``typed`` is its count, in one transaction holding its rows' locks from the
    check to the act. Returns the verdict, the selection as it is now, and the ids done."""
    with translate_errors(f"{verb} of dead letters"), engine.begin() as conn:
        now = db_outbox.outbox_dead_selection_locked(conn, chosen)
        if not now.ids or confirm_digest(verb, chosen, now) != digest:
            return Verdict.CHANGED, now, []
        if typed != str(len(now.ids)):
            return Verdict.WRONG_COUNT, now, []
        return Verdict.DONE, now, _act(conn, verb, now.ids)


def _item(row: dict) -> dict[str, Any]:
    return {"id": row["id"], "idempotency_key": row["idempotency_key"], "schedule": row["schedule"],
            "task": row["task"], "attempts": row["attempts"], "last_error": row["last_error"],
            "dead_at": iso(row["dead_at"])}
