"""`cronkeeper web` over real HTTP, as a real process on a seeded database: the security model
of SPEC §13 (headers on every response, Host allowlist, token and cookie, CSRF and
Sec-Fetch-Site, read-only mode, refusing a non-loopback address without a token), escaping,
and the JSON mirrors against the CLI's --format json on the same database."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
from datetime import timedelta
from urllib.parse import urlencode

import psycopg
import pytest
from web_seed import CRONKEEPER, XSS, WebServer, drop, freshen, libpq, seed

from cronkeeper.web.security import CSP

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def seeded(database_url):
    s = seed(database_url)
    yield s
    drop(database_url, s.schema)


@pytest.fixture(scope="module")
def servers(seeded, tmp_path_factory):
    logs = tmp_path_factory.mktemp("web-logs")
    started = {}
    try:
        args = (seeded.url, seeded.schema, seeded.cluster)
        started["ro"] = WebServer(*args, log=logs / "ro.log")
        started["act"] = WebServer(*args, "--allow-actions", log=logs / "act.log")
        started["tok"] = WebServer(*args, "--allow-actions", "--allowed-host", "ck.example",
                                   log=logs / "tok.log", env={"CRONKEEPER_WEB_TOKEN": TOKEN})
        yield started
    finally:
        for server in started.values():
            server.stop()


class Reply:
    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.status = resp.status
        self.headers = resp.headers
        self.cookies = resp.headers.get_all("Set-Cookie") or []
        self.text = resp.read().decode()


def call(server, method: str, path: str, *, headers: dict | None = None,
         form: dict | None = None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = None
    headers = dict(headers or {})
    if form is not None:
        body = urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    conn.request(method, path, body=body, headers=headers)
    try:
        return Reply(conn.getresponse())
    finally:
        conn.close()


def cookie_of(reply: Reply, name: str) -> str | None:
    for c in reply.cookies:
        if c.startswith(f"{name}="):
            return c.split(";")[0].split("=", 1)[1]
    return None


def session(server, path="/", headers=None) -> tuple[str, str]:
    """A browser's first visit: its session cookie and the page's CSRF token."""
    reply = call(server, "GET", path, headers=headers)
    sid = cookie_of(reply, "ck_sid")
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', reply.text)
    assert sid and found, reply.text[:500]
    return sid, found.group(1)


def assert_security_headers(reply: Reply) -> None:
    assert reply.headers["Content-Security-Policy"] == CSP
    assert "script-src" not in CSP and "unsafe-inline" not in CSP
    assert "default-src 'none'" in CSP
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    assert reply.headers["Referrer-Policy"] == "no-referrer"


# -- headers, hosts, binding ------------------------------------------------------------------


def test_security_headers_on_every_response_errors_too(servers):
    ro = servers["ro"]
    replies = {
        "page": call(ro, "GET", "/"),
        "css": call(ro, "GET", "/static/style.css"),
        "json": call(ro, "GET", "/api/status"),
        "404": call(ro, "GET", "/no/such/page"),
        "bad host": call(ro, "GET", "/", headers={"Host": "evil.example"}),
        "bad param": call(ro, "GET", "/?page=abc"),
        "read-only POST": call(ro, "POST", "/schedules/alpha/pause", form={}),
        "401": call(servers["tok"], "GET", "/"),
    }
    codes = {k: r.status for k, r in replies.items()}
    assert codes == {"page": 200, "css": 200, "json": 200, "404": 404, "bad host": 400,
                     "bad param": 400, "read-only POST": 403, "401": 401}
    for reply in replies.values():
        assert_security_headers(reply)


def test_host_allowlist_refuses_dns_rebinding(servers):
    ro, tok = servers["ro"], servers["tok"]
    assert call(ro, "GET", "/", headers={"Host": "attacker.example:9480"}).status == 400
    assert call(ro, "GET", "/api/status", headers={"Host": "attacker.example"}).status == 400
    assert call(ro, "GET", "/", headers={"Host": f"localhost:{ro.port}"}).status == 200
    assert call(ro, "GET", "/", headers={"Host": f"127.0.0.1:{ro.port}"}).status == 200
    # --allowed-host adds a name (here on the token server: it still needs the token)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert call(tok, "GET", "/", headers={**auth, "Host": "ck.example"}).status == 200
    assert call(tok, "GET", "/", headers={**auth, "Host": "other.example"}).status == 400


def test_non_loopback_address_without_token_is_refused_at_start(seeded, tmp_path):
    base = [CRONKEEPER, "web", "--database-url", seeded.url, "--schema", seeded.schema]
    # 192.0.2.1 (TEST-NET-1) is never this machine's: nothing is ever exposed
    refused = subprocess.run([*base, "--address", "192.0.2.1:9480"], capture_output=True,
                             text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert refused.returncode == 2, refused.stderr
    assert "needs a token" in refused.stderr and "Traceback" not in refused.stderr
    # with a token it goes on to bind, and says why it cannot: the refusal above was the rule
    empty = tmp_path / "token"
    empty.write_text("")
    no_token = subprocess.run([*base, "--address", "192.0.2.1:9480", "--token-file", str(empty)],
                              capture_output=True, text=True, timeout=60)
    assert no_token.returncode == 2 and "is empty" in no_token.stderr
    good = tmp_path / "good"
    good.write_text(TOKEN + "\n")
    bound = subprocess.run([*base, "--address", "192.0.2.1:9480", "--token-file", str(good)],
                           capture_output=True, text=True, timeout=60)
    assert bound.returncode == 1 and "cannot listen on 192.0.2.1:9480" in bound.stderr
    assert "Traceback" not in bound.stderr


# -- token, cookie, bearer ---------------------------------------------------------------------


def test_token_required_and_exchanged_for_a_strict_cookie(servers):
    tok = servers["tok"]
    page = call(tok, "GET", "/instances")
    assert page.status == 401 and 'name="token"' in page.text  # the login form
    api = call(tok, "GET", "/api/status")
    assert api.status == 401 and json.loads(api.text)["status"] == 401
    assert api.headers["WWW-Authenticate"].startswith("Bearer")
    assert call(tok, "GET", "/api/status",
                headers={"Authorization": "Bearer wrong"}).status == 401
    assert call(tok, "GET", "/api/status",
                headers={"Authorization": f"Bearer {TOKEN}"}).status == 200
    assert call(tok, "GET", "/queue?token=wrong").status == 401

    link = call(tok, "GET", f"/queue?refresh=30&token={TOKEN}")
    assert link.status == 303
    assert link.headers["Location"] == "/queue?refresh=30"  # the token leaves the URL
    auth_cookie = next(c for c in link.cookies if c.startswith("ck_auth="))
    assert "HttpOnly" in auth_cookie and "SameSite=Strict" in auth_cookie
    jar = "; ".join(c.split(";")[0] for c in link.cookies)
    page = call(tok, "GET", "/queue?refresh=30", headers={"Cookie": jar})
    assert page.status == 200 and TOKEN not in page.text
    assert '<meta http-equiv="refresh" content="30">' in page.text
    # the auth cookie is bound to its session: with another session id it is worthless
    forged = re.sub(r"ck_sid=[0-9a-f]+", "ck_sid=" + "0" * 32, jar)
    assert call(tok, "GET", "/queue", headers={"Cookie": forged}).status == 401


def test_login_form_needs_csrf_and_the_right_token(servers):
    tok = servers["tok"]
    sid, csrf = session(tok, "/login")
    cookie = {"Cookie": f"ck_sid={sid}"}
    assert call(tok, "POST", "/login", form={"token": TOKEN, "next": "/"}, headers=cookie).status == 403
    wrong = call(tok, "POST", "/login", form={"token": "nope", "csrf": csrf}, headers=cookie)
    assert wrong.status == 401 and "not right" in wrong.text
    ok = call(tok, "POST", "/login", form={"token": TOKEN, "csrf": csrf, "next": "//evil.example"},
              headers=cookie)
    assert ok.status == 303 and ok.headers["Location"] == "/"  # no open redirect
    assert cookie_of(ok, "ck_auth")


# -- POST rules --------------------------------------------------------------------------------


def paused(seeded, name: str) -> bool | None:
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as c:
        row = c.execute("SELECT paused FROM schedule_controls WHERE schedule = %s",
                        (name,)).fetchone()
    return None if row is None else row[0]


def test_read_only_has_no_buttons_and_every_post_is_403(servers, seeded):
    ro = servers["ro"]
    for path in ("/", "/schedules/alpha", "/dlq", f"/dlq/{seeded.dead_ids[0]}"):
        page = call(ro, "GET", path)
        assert page.status == 200 and 'method="post"' not in page.text, path
    for path in ("/schedules/alpha/pause", "/schedules/alpha/trigger", "/dlq/confirm",
                 "/dlq/act"):
        reply = call(ro, "POST", path, form={"verb": "replay", "ids": "1"})
        assert reply.status == 403 and "read-only" in reply.text, path
    assert paused(seeded, "alpha") is None


def test_csrf_and_sec_fetch_site_guard_every_action(servers, seeded):
    act = servers["act"]
    sid, csrf = session(act, "/schedules/alpha")
    cookie = {"Cookie": f"ck_sid={sid}"}
    path = "/schedules/alpha/pause"
    assert call(act, "POST", path, form={}, headers=cookie).status == 403
    assert call(act, "POST", path, form={"csrf": "0" * 64}, headers=cookie).status == 403
    assert call(act, "POST", path, form={"csrf": csrf}).status == 403  # token of another session
    cross = call(act, "POST", path, form={"csrf": csrf},
                 headers={**cookie, "Sec-Fetch-Site": "cross-site"})
    assert cross.status == 403 and "another site" in cross.text
    assert paused(seeded, "alpha") is None  # nothing got through
    ok = call(act, "POST", path, form={"csrf": csrf},
              headers={**cookie, "Sec-Fetch-Site": "same-origin"})
    assert ok.status == 303 and paused(seeded, "alpha") is True
    back = call(act, "POST", "/schedules/alpha/resume", form={"csrf": csrf}, headers=cookie)
    assert back.status == 303 and paused(seeded, "alpha") is False


def test_state_and_owner_filters(servers):
    def listed(query: str) -> list[str]:
        reply = call(servers["ro"], "GET", "/" + query)
        assert reply.status == 200, reply.text[-500:]
        return re.findall(r'<tr data-schedule="([^"]+)"', reply.text)

    everyone = ["alpha", "gamma", "march-sundays", "november-sundays"]
    assert listed("") == everyone  # dst-nightly was removed: not in force, not listed
    assert listed("?state=missing") == ["alpha"]
    assert listed("?state=dead") == ["alpha"]
    assert listed("?state=running") == ["alpha"]
    assert listed("?state=skipped") == ["alpha"]
    assert listed("?state=emitted") == ["alpha"]
    assert listed("?state=pending") == ["gamma"]
    assert listed("?owner=team-b") == ["gamma"]
    assert listed("?owner=team-b&state=missing") == []
    assert listed("?per_page=2&page=2") == everyone[2:]
    assert call(servers["ro"], "GET", "/?state=bogus").status == 400
    assert listed("?per_page=1000") == everyone  # the most rows a page shows
    too_many = call(servers["ro"], "GET", "/?per_page=1001")
    assert too_many.status == 400 and "per_page must be at most 1000" in too_many.text


# -- escaping, errors --------------------------------------------------------------------------


def test_markup_in_descriptions_and_errors_renders_as_text(servers, seeded):
    ro = servers["ro"]
    for path in ("/", "/schedules/alpha", "/dlq", f"/dlq/{seeded.dead_ids[0]}"):
        text = call(ro, "GET", path).text
        assert XSS not in text and "<script" not in text, path
        assert "&lt;script&gt;" in text, path
    missing = call(ro, "GET", "/schedules/%3Cscript%3Ex")
    assert missing.status == 404 and "<script>x" not in missing.text


# -- JSON mirrors: the CLI's own text ----------------------------------------------------------


def cli_json(seeded, *args: str) -> str:
    out = subprocess.run([CRONKEEPER, *args, "--database-url", seeded.url, "--schema",
                          seeded.schema, "--format", "json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode in (0, 1), out.stderr
    return out.stdout


def test_history_dlq_explain_mirrors_are_the_cli_text(servers, seeded):
    ro = servers["ro"]
    since = seeded.m(0).strftime("%Y-%m-%dT%H:%M:%SZ")
    until = seeded.m(20).strftime("%Y-%m-%dT%H:%M:%SZ")
    web = call(ro, "GET", f"/api/history?schedule=alpha&since={since}&until={until}")
    cli = cli_json(seeded, "history", "alpha", "--since", since, "--until", until)
    assert web.status == 200 and web.headers["Content-Type"] == "application/json"
    assert web.text == cli
    statuses = [p["status"] for p in json.loads(cli)["periods"]]
    assert statuses == ["emitted", "skipped", "missing", "emitted", "skipped", "emitted",
                        "missing"]
    assert call(ro, "GET", "/api/dlq").text == cli_json(seeded, "dlq", "list")
    key = f"alpha@{seeded.m(4).strftime('%Y-%m-%dT%H:%M:%SZ')}"
    assert call(ro, "GET", f"/api/explain/{key}").text == cli_json(seeded, "explain", key)
    first = seeded.dead_ids[0]
    assert (call(ro, "GET", f"/api/dlq/{first}").text
            == cli_json(seeded, "dlq", "show", str(first)))


def test_status_mirror_is_the_cli_document(servers, seeded):
    freshen(seeded)
    web = json.loads(call(servers["ro"], "GET", "/api/status").text)
    cli = json.loads(subprocess.run(
        [CRONKEEPER, "status", "--database-url", seeded.url, "--schema", seeded.schema,
         "--cluster", seeded.cluster, "--format", "json"], capture_output=True, text=True,
        timeout=60).stdout)

    def steady(doc):  # what changes between two reads a second apart
        doc.pop("now")
        doc["last_leader"].pop("heartbeat_age_seconds")
        for o in doc["queue"]["oldest_available"]:
            o.pop("age_seconds")
        doc["diagnosis"] = [re.sub(r"\d+s", "Ns", d) for d in doc["diagnosis"]]
        return doc

    assert steady(web) == steady(cli)
    assert web["leader"] is None and {i["instance_id"] for i in web["instances"]} == {
        "sched-a", "sched-b", "worker-1"}


def test_versions_cache_reads_only_new_versions_and_notices_removals(engine, schema):
    from web_seed import Seeder, spec

    from cronkeeper.web.pages import VersionsCache

    cache = VersionsCache()
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        seeder = Seeder(raw)
        now = seeder.now()
        seeder.version(spec("a", every=60), "a", now)
        raw.commit()
        assert [v.spec.every for v in cache.get(conn)["a"]] == [60]
        seeder.version(spec("a", every=120), "a", now + timedelta(seconds=1))
        seeder.version(spec("b", every=30), "b", now)
        raw.commit()
        got = cache.get(conn)
        assert [v.spec.every for v in got["a"]] == [60, 120] and [v.spec.every for v in got["b"]] == [30]
        raw.execute("DELETE FROM schedule_versions WHERE schedule = 'b'")
        raw.commit()
        assert set(cache.get(conn)) == {"a"}


def test_every_page_says_when_nothing_leads_and_what_becomes_of_the_periods(servers, seeded):
    """The seeded cluster's last leader released its lock: every page carries the banner, and
    says that each schedule's misfire policy decides the missing periods once one leads; a
    visitor who has not signed in learns nothing of it; with a live leader no page has it."""
    pages = ["/", "/instances", "/queue", "/dlq", "/explain", "/schedules/alpha"]
    for path in pages:
        reply = call(servers["ro"], "GET", path)
        assert reply.status == 200, (path, reply.status)
        banner = re.search(r'<p class="banner bad" id="no-leader"[^>]*>(.*?)</p>', reply.text, re.S)
        assert banner, path
        assert "nothing fires until one leads" in banner[1]
        assert "misfire policy decides them" in banner[1], path
    login = call(servers["tok"], "GET", "/", headers={"Host": "ck.example"})
    assert login.status == 401 and 'id="no-leader"' not in login.text
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as conn:
        saved = conn.execute("SELECT heartbeat_at, released_at FROM leadership WHERE cluster = %s",
                             (seeded.cluster,)).fetchone()
        conn.execute("UPDATE leadership SET heartbeat_at = now(), released_at = NULL "
                     "WHERE cluster = %s", (seeded.cluster,))
        conn.commit()
        try:
            for path in pages:
                assert 'id="no-leader"' not in call(servers["ro"], "GET", path).text, path
        finally:
            conn.execute("UPDATE leadership SET heartbeat_at = %s, released_at = %s "
                         "WHERE cluster = %s", (*saved, seeded.cluster))
            conn.commit()
