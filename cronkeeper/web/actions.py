"""The POSTs, served only with ``--allow-actions`` (without it the gate answers 403 before any
of this runs): pause, resume, trigger, and replay or discard of dead letters.

Replay and discard ask every time, as the CLI does: the first POST shows a confirmation page
that states the exact count and the tasks touched, and asks the operator to type the count.
The confirmation carries the selected ids and a digest of their current state; the second
POST re-reads those ids and refuses (409, nothing done) when the digest no longer matches (a
job was replayed, discarded or retried meanwhile). A wrong count asks again."""

from __future__ import annotations

import hashlib
import logging

from flask import Flask, Response, abort, redirect, render_template, request, url_for

from cronkeeper.operations import dlq as dead_letters
from cronkeeper.operations.control import set_paused, trigger_job
from cronkeeper.web.context import ctx
from cronkeeper.web.routes import MAX_ID

log = logging.getLogger("cronkeeper.web")
VERBS = ("replay", "discard")


def selection_digest(verb: str, rows: list[dict]) -> str:
    """What the operator confirmed: the verb and each selected dead letter's id, attempts,
    dead-at instant and error (the rows are dead ones: a job no longer dead drops out)."""
    text = verb + "|" + "|".join(
        f"{r['id']}:{r['attempts']}:{r['dead_at']}:{r['last_error']}"
        for r in sorted(rows, key=lambda r: r["id"]))
    return hashlib.sha256(text.encode()).hexdigest()


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
        verb = request.form.get("verb", "")
        if verb not in VERBS:
            abort(400, "verb must be replay or discard")
        f = request.form
        ids = _ids(f.get("ids", "")) or None
        rows = dead_letters.select_dead(ctx().engine, f.get("schedule") or None,
                                   f.get("task") or None, f.get("older_than") or None,
                                   f.get("newer_than") or None, ids)
        if not rows:
            return _page(verb, [], "no dead letters match; nothing to do", 200)
        return _page(verb, rows, None, 200)

    @app.post("/dlq/act")
    def act():
        verb = request.form.get("verb", "")
        if verb not in VERBS:
            abort(400, "verb must be replay or discard")
        ids = _ids(request.form.get("ids", ""))
        if not ids:
            abort(400, "no dead letters selected")
        rows = dead_letters.select_dead(ctx().engine, None, None, None, None, ids)
        if len(rows) != len(ids) or selection_digest(verb, rows) != request.form.get("digest"):
            return _page(verb, rows, "refused: the selection changed since you confirmed it "
                         f"({len(ids)} selected, {len(rows)} still dead and unchanged). Nothing "
                         "was done; check the jobs below and confirm again.", 409)
        typed = request.form.get("count", "").strip()
        if typed != str(len(rows)):
            return _page(verb, rows, f"you typed {typed or 'nothing'!s}; to {verb} these jobs, "
                         f"type their exact count, {len(rows)}", 422)
        done = dead_letters.apply(ctx().engine, verb, ids)
        log.info("web: %s of %d dead letters (%s)", verb, len(done), ",".join(map(str, done)),
                 extra={"action": f"web_dlq_{verb}"})
        return render_template("done.html", verb=verb, done=done,
                               tasks=dead_letters.tasks_touched(rows))


def _page(verb: str, rows: list[dict], message: str | None, code: int) -> Response:
    return Response(render_template(
        "confirm.html", verb=verb, rows=dead_letters.list_document(rows),
        tasks=dead_letters.tasks_touched(rows), ids=",".join(str(r["id"]) for r in rows),
        digest=selection_digest(verb, rows), message=message), code)
