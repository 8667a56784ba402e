"""The POSTs, served only with ``--allow-actions`` (without it the gate answers 403 before any
of this runs): pause, resume, trigger, and replay or discard of dead letters.

Replay and discard ask every time, as the CLI does: the first POST shows a confirmation page
that states the exact count of the whole selection and the tasks touched, with its first
rows, and asks the operator to type the count. The confirmation carries the filter (its ages
made instants, so it selects the same rows later) and a digest the database computes over
every selected row; the second POST selects again under row locks and refuses (409, nothing
done) when the digest no longer matches (a job was replayed, discarded or retried meanwhile,
or died under the filter), else acts on exactly those rows in the same transaction. A wrong
count asks again. No page holds the selection's rows, so 100,000 dead letters confirm as 10."""

from __future__ import annotations

import logging
from datetime import datetime

from flask import Flask, Response, abort, redirect, render_template, request, url_for

from cronkeeper.db.outbox import DeadFilter
from cronkeeper.operations import dlq as dead_letters
from cronkeeper.operations.control import set_paused, trigger_job
from cronkeeper.web.context import ctx
from cronkeeper.web.routes import MAX_ID, dlq_filter

# Rows a confirmation page shows of its selection (the count and the tasks are the whole's).
SAMPLE = 20

log = logging.getLogger("cronkeeper.web")
VERBS = ("replay", "discard")


def _ids(text: str) -> list[int]:
    try:
        ids = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        abort(400, "ids must be whole numbers")
    if any(not -MAX_ID - 1 <= i <= MAX_ID for i in ids):
        abort(400, f"ids must be job ids (at most {MAX_ID})")
    return ids


def _who() -> str:
    return f"web:{request.remote_addr or 'unknown'}"


def register(app: Flask) -> None:
    @app.post("/schedules/<name>/<action>")
    def control(name: str, action: str):
        engine = ctx().engine
        if action in ("pause", "resume"):
            set_paused(engine, name, action == "pause", _who())
            done = "paused" if action == "pause" else "resumed"
        elif action == "trigger":
            job_id, key = trigger_job(engine, name)
            log.info("web: triggered %s (job %s)", name, job_id, extra={"action": "web_trigger"})
            done = "triggered"
        else:
            abort(404, f"no action {action!r}")
        log.info("web: %s %s", done, name, extra={"action": f"web_{action}"})
        return redirect(url_for("schedule_page", name=name, done=done), code=303)

    @app.post("/dlq/confirm")
    def confirm():
        verb = _verb()
        ids = _ids(request.form.get("ids", "")) or None
        chosen = dlq_filter(request.form)
        chosen = DeadFilter(chosen.schedule, chosen.task, chosen.dead_before, chosen.dead_after,
                            None if ids is None else tuple(ids))
        found = dead_letters.confirmation(ctx().engine, verb, chosen, SAMPLE)
        if not found.selection.ids:
            return _page(verb, chosen, found, "no dead letters match; nothing to do", 200)
        return _page(verb, chosen, found, None, 200)

    @app.post("/dlq/act")
    def act():
        verb, f = _verb(), request.form
        ids = _ids(f.get("ids", "")) or None
        chosen = DeadFilter(f.get("schedule") or None, f.get("task") or None,
                            _instant("dead_before"), _instant("dead_after"),
                            None if ids is None else tuple(ids))
        typed = f.get("count", "").strip()
        verdict, now, done = dead_letters.apply_confirmed(ctx().engine, verb, chosen,
                                                          f.get("digest", ""), typed)
        if verdict is not dead_letters.Verdict.DONE:
            found = dead_letters.confirmation(ctx().engine, verb, chosen, SAMPLE)
            if verdict is dead_letters.Verdict.CHANGED:
                return _page(verb, chosen, found, "refused: the selection changed since you "
                             f"confirmed it (it holds {len(now.ids)} dead letters now). Nothing "
                             "was done; check the jobs below and confirm again.", 409)
            return _page(verb, chosen, found, f"you typed {typed or 'nothing'!s}; to {verb} "
                         f"these jobs, type their exact count, {len(now.ids)}", 422)
        log.info("web: %s of %d dead letters (%s; selected by %s)", verb, len(done), _span(done),
                 _fields(chosen), extra={"action": f"web_dlq_{verb}"})
        return render_template("done.html", verb=verb, done=done, tasks=now.tasks)


def _verb() -> str:
    verb = request.form.get("verb", "")
    if verb not in VERBS:
        abort(400, "verb must be replay or discard")
    return verb


def _instant(name: str) -> datetime | None:
    text = request.form.get(name) or None
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        abort(400, f"{name} must be an ISO 8601 instant")
    if value.tzinfo is None:
        abort(400, f"{name} must be an instant with its UTC offset")
    return value


def _span(ids: list[int]) -> str:
    """The ids done, for the log: all of a few, the count and ends of many."""
    if len(ids) <= 20:
        return ",".join(map(str, ids))
    return f"{ids[0]}..{ids[-1]}, {len(ids)} ids"


def _page(verb: str, chosen: DeadFilter, found: dead_letters.Confirmation, message: str | None,
          code: int) -> Response:
    return Response(render_template(
        "confirm.html", verb=verb, count=len(found.selection.ids), tasks=found.selection.tasks,
        rows=dead_letters.list_document(found.sample), fields=_fields(chosen), digest=found.digest,
        message=message), code)


def _fields(chosen: DeadFilter) -> dict[str, str]:
    """The filter as the confirmation form carries it (and the log says it)."""
    return {"schedule": chosen.schedule or "", "task": chosen.task or "",
            "dead_before": dead_letters.iso(chosen.dead_before) or "",
            "dead_after": dead_letters.iso(chosen.dead_after) or "",
            "ids": ",".join(map(str, chosen.ids or ()))}
