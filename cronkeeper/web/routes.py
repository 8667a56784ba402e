"""The read-only pages and their JSON mirrors (docs/web.md). Every JSON mirror is the text the CLI
prints for ``--format json``, made by the same function."""

from __future__ import annotations

import io
import re
from typing import Any

from flask import Flask, Response, abort, g, redirect, render_template, request, url_for
from werkzeug.wrappers import Response as WerkzeugResponse

from cronkeeper.db.engine import translate_errors
from cronkeeper.db.outbox import DeadFilter
from cronkeeper.errors import CronkeeperError, DatabaseError, UsageError
from cronkeeper.operations import dlq as dead_letters
from cronkeeper.operations import explain as period_story
from cronkeeper.operations import history as audit_history
from cronkeeper.operations import output as job_output
from cronkeeper.operations import status as cluster_status
from cronkeeper.output import as_text
from cronkeeper.timing import TimingError, parse_instant
from cronkeeper.web import pages, security
from cronkeeper.web.context import ctx, login_redirect
from cronkeeper.web.security import local_path
from cronkeeper.web.strip import MAX_PERIODS, CellState

HISTORY_PAGE = 100
# Dead letters a page of /dlq shows. A flood (a dependency down overnight) is tens of thousands
# of them, each with an error of a few KB: 50,000 in one page were 116 MB of HTML, and the web
# process grew by 200 MB for each such request (docs/web.md). The count is the whole selection's.
DLQ_PAGE = 100
# The most schedules one page of the schedules list shows. A product limit, not a speed one: a
# page of 1,000 rows is 14 MB of HTML and 48,000 strip cells; all 10,000 of the benchmark's
# schedules would be 140 MB, which a browser takes tens of seconds to lay out, and nobody reads
# that many rows: the state and owner filters find the ones that matter (docs/web.md).
MAX_PER_PAGE = 1000
STATE_FILTERS = [s.value for s in CellState] + ["paused"]
# A job id is a bigint: a larger one names no job (404); the database would refuse it (503).
MAX_ID = 2**63 - 1


def _int(name: str, default: int, lo: int, hi: int) -> int:
    value = request.args.get(name)
    if value is None or value == "":
        return default
    if not value.isdigit():
        abort(400, f"{name} must be a whole number")
    return max(lo, min(hi, int(value)))


def _per_page() -> int:
    per_page = _int("per_page", pages.PER_PAGE, 1, 10**9)
    if per_page > MAX_PER_PAGE:
        abort(400, f"per_page must be at most {MAX_PER_PAGE}: use the state and owner filters "
                   f"to find schedules, or the next pages")
    return per_page


def _json(text: str) -> Response:
    return Response(text if text.endswith("\n") else text + "\n", mimetype="application/json")


def _status_doc() -> dict[str, Any]:
    c = ctx()
    doc = cluster_status.gather(c.engine, c.schema, c.cluster)
    doc["database"] = c.database
    return doc


def dlq_filter(form: Any = None) -> DeadFilter:
    a = request.args if form is None else form
    try:
        return dead_letters.choose(ctx().engine, a.get("schedule") or None, a.get("task") or None,
                                   a.get("older_than") or None, a.get("newer_than") or None)
    except UsageError as exc:
        abort(400, str(exc))


def register(app: Flask) -> None:
    @app.context_processor
    def common() -> dict[str, Any]:
        refresh = request.args.get("refresh", "")
        return {"refresh": max(5, min(3600, int(refresh))) if refresh.isdigit() else None,
                "csrf": g.get("csrf"), "actions": g.get("actions", False),
                "token_mode": bool(ctx().config.token), "authed": g.get("authed", False)}

    @app.get("/")
    def schedules_page():
        c = ctx()
        state = request.args.get("state") or None
        if state and state not in STATE_FILTERS:
            abort(400, f"state must be one of {', '.join(STATE_FILTERS)}")
        with pages.collector_paused():
            data = pages.schedules(
                c.engine, c.cache, owner=request.args.get("owner") or None, state=state,
                page=_int("page", 1, 1, 10**6),
                per_page=_per_page(),
                periods=_int("periods", c.config.periods, 1, MAX_PERIODS))
            return render_template("schedules.html", **data,
                                   owner=request.args.get("owner") or "", state=state or "",
                                   states=STATE_FILTERS)

    @app.get("/schedules/<name>")
    def schedule_page(name: str):
        c = ctx()
        since, until = request.args.get("since") or "24h", request.args.get("until") or None
        try:
            end = parse_instant(until) if until else None
        except TimingError as exc:
            abort(400, f"until: {exc}")
        data = pages.schedule_detail(c.engine, c.cache, name, until=end,
                                     periods=_int("periods", c.config.periods, 1, MAX_PERIODS))
        if data is None:
            abort(404, f"no schedule named {name!r} is known to the cluster")
        try:
            audit = audit_history.collect(c.engine, [name], since, until)
        except UsageError as exc:
            abort(400, str(exc))
        status = request.args.get("status") or ""
        rows = [r for r in audit.rows if not status or r.status == status
                or (status == "dead" and r.job_state == "dead")][::-1]
        page = _int("page", 1, 1, 10**6)
        shown = rows[(page - 1) * HISTORY_PAGE: page * HISTORY_PAGE]
        return render_template(
            "schedule.html", **data, history=shown, summary=audit.summary, notes=audit.notes,
            since=since, until=until or "", status=status, page=page,
            pages=max(1, -(-len(rows) // HISTORY_PAGE)), total=len(rows),
            statuses=["emitted", "skipped", "pending", "missing", "dead"],
            done=request.args.get("done", ""))

    @app.get("/instances")
    def instances_page():
        c = ctx()
        return render_template("instances.html", **pages.instances(c.engine, c.cluster,
                                                                   _status_doc()))

    @app.get("/queue")
    def queue_page():
        return render_template("queue.html", **pages.queue(ctx().engine))

    @app.get("/dlq")
    def dlq_page():
        page = _int("page", 1, 1, 10**6)
        rows, tasks = dead_letters.dead_page(ctx().engine, dlq_filter(), page, DLQ_PAGE)
        total = sum(tasks.values())
        filters = {k: request.args.get(k, "") for k in
                   ("schedule", "task", "older_than", "newer_than")}
        return render_template("dlq.html", rows=dead_letters.list_document(rows), total=total,
                               first=(page - 1) * DLQ_PAGE + 1, page=page,
                               pages=max(1, -(-total // DLQ_PAGE)), filters=filters,
                               links={k: v for k, v in filters.items() if v}, tasks=tasks)

    @app.get(f"/dlq/<int(max={MAX_ID}):job_id>")
    def dead_letter_page(job_id: int):
        rows = dead_letters.select_dead(ctx().engine, None, None, None, None, [job_id])
        if not rows:
            abort(404, f"no dead letter with id {job_id} (replayed, discarded, or never dead)")
        return render_template("dead_letter.html",
                               item=dead_letters.show_document(ctx().engine, rows[0]))

    @app.get("/explain")
    def explain_form():
        key = request.args.get("key", "").strip()
        if key:
            return redirect(url_for("explain_page", key=key), code=303)
        return render_template("explain.html", story=None, key="")

    @app.get("/explain/<path:key>")
    def explain_page(key: str):
        with translate_errors("reading the period's story"), ctx().engine.connect() as conn:
            try:
                story = period_story.story(conn, key)
            except DatabaseError:
                raise
            except CronkeeperError as exc:
                abort(404, str(exc))
        return render_template("explain.html", story=story, key=key)

    @app.get("/login")
    def login_page():
        if g.authed and ctx().config.token:
            return redirect(_safe_next(request.args.get("next")), code=303)
        return render_template("login.html", next=_safe_next(request.args.get("next")),
                               failed=False)

    app.post("/login")(login_post)

    @app.post("/logout")
    def logout():
        resp = redirect("/login", code=303)
        resp.delete_cookie("ck_auth", path="/")
        resp.delete_cookie("ck_sid", path="/")  # the browser forgets both (stateless: a copied
        return resp  # pair stays valid until the token changes, see docs/web.md)

    # JSON mirrors: the CLI's --format json, byte for byte.
    @app.get("/api/status")
    def api_status():
        return _json(cluster_status.dumps(_status_doc()))

    @app.get("/api/history")
    def api_history():
        names = [n for n in request.args.getlist("schedule") if n]
        try:
            audit = audit_history.collect(ctx().engine, names, request.args.get("since") or "24h",
                                        request.args.get("until") or None)
        except UsageError as exc:
            abort(400, str(exc))
        out = io.StringIO()
        audit_history.write_json(audit, out)
        return _json(out.getvalue())

    @app.get("/api/dlq")
    def api_dlq():
        limit, offset = request.args.get("limit"), request.args.get("offset")
        for name, value in (("limit", limit), ("offset", offset)):
            if value is not None and not value.isdigit():
                abort(400, f"{name} must be a whole number")
        if limit is not None and not 1 <= int(limit) <= dead_letters.MAX_DOCUMENT:
            abort(400, f"limit must be from 1 to {dead_letters.MAX_DOCUMENT}")
        try:
            rows = dead_letters.listing(ctx().engine, dlq_filter(),
                                        None if limit is None else int(limit), int(offset or 0))
        except UsageError as exc:
            abort(400, str(exc))
        return _json(dead_letters.dumps(dead_letters.list_document(rows)))

    @app.get(f"/api/dlq/<int(max={MAX_ID}):job_id>")
    def api_dead_letter(job_id: int):
        rows = dead_letters.select_dead(ctx().engine, None, None, None, None, [job_id])
        if not rows:
            abort(404, f"no dead letter with id {job_id}")
        return _json(dead_letters.dumps(dead_letters.show_document(ctx().engine, rows[0])))

    @app.get("/api/explain/<path:key>")
    def api_explain(key: str):
        with translate_errors("reading the period's story"), ctx().engine.connect() as conn:
            try:
                return _json(period_story.dumps(period_story.story(conn, key)))
            except DatabaseError:
                raise
            except CronkeeperError as exc:
                abort(404, str(exc))

    @app.get("/api/output/<path:key>")
    def api_output(key: str):
        """What an attempt printed, as ``cronkeeper output`` gives it, but as text: invalid
        UTF-8 replaced (U+FFFD). 404 for an unknown key or attempt."""
        attempt = request.args.get("attempt")
        if attempt is not None and not re.fullmatch(r"-?\d{1,9}", attempt):
            abort(400, "attempt must be a whole number")
        try:
            found = job_output.attempt_output(ctx().engine, key,
                                              int(attempt) if attempt is not None else None)
        except job_output.OutputNotFound as exc:
            abort(404, str(exc))
        return Response(as_text(found.output or b""), content_type="text/plain; charset=utf-8")

    @app.get("/api/csrf")
    def api_csrf():
        """For scripts that act: the CSRF token of the session cookie this response sets."""
        return {"csrf": g.csrf}


def _safe_next(target: str | None) -> str:
    return local_path(target)


def login_post() -> WerkzeugResponse:
    config = ctx().config
    if config.token and security.same_token(request.form.get("token"), config.token):
        return login_redirect(request.form.get("next") or "/")
    return Response(render_template("login.html", next=request.form.get("next") or "/",
                                    failed=True), 401)
