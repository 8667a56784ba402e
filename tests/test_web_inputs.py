"""`cronkeeper web` given input no page expects, over real HTTP against a real server process on
a seeded PostgreSQL: a NUL character, an id past bigint, an age reaching back before year 1, a
token file that is not text, and control characters in a dead letter's error. Each is a clear
400 or 404 (or a clear start-up error), never a 500 and never a 503 that blames the database."""

from __future__ import annotations

import subprocess

import psycopg
import pytest
from test_web_http import call, session
from web_seed import CRONKEEPER, Seeder, WebServer, drop, libpq, seed

BLAMES_DATABASE = "database could not answer"


@pytest.fixture(scope="module")
def seeded(database_url):
    s = seed(database_url)
    with psycopg.connect(libpq(s.url), options=f"-c search_path={s.schema}") as conn:
        # What a job printed and raised, ending in its last error: a colour escape, a
        # carriage return that hides what came before, and a right-to-left override.
        Seeder(conn).job("ctl@2026-01-01T00:00:00Z", None, None, None, "dead", 1,
                         "fine\x1b[2K\rall good \u202etxt.exe", task="t.ctl")
    yield s
    drop(database_url, s.schema)


@pytest.fixture(scope="module")
def server(seeded, tmp_path_factory):
    started = WebServer(seeded.url, seeded.schema, seeded.cluster, "--allow-actions",
                        log=tmp_path_factory.mktemp("web-inputs") / "web.log")
    yield started
    started.stop()


def test_nul_in_a_key_or_filter_is_a_400_not_a_database_outage(server):
    for path in ("/explain/a%00b", "/api/explain/a%00b", "/api/output/a%00b",
                 "/schedules/a%00b", "/api/history?schedule=a%00b", "/dlq?schedule=a%00b",
                 "/api/dlq?task=a%00b", "/?owner=a%00b"):
        reply = call(server, "GET", path)
        assert reply.status == 400, (path, reply.status, reply.text[:300])
        assert "NUL" in reply.text and BLAMES_DATABASE not in reply.text, path
    sid, csrf = session(server, "/dlq")
    posted = call(server, "POST", "/dlq/confirm", headers={"Cookie": f"ck_sid={sid}"},
                  form={"csrf": csrf, "verb": "replay", "task": "a\x00b"})
    assert posted.status == 400 and BLAMES_DATABASE not in posted.text


def test_an_id_past_bigint_is_unknown_not_a_database_outage(server):
    huge = "9" * 23
    for path in (f"/dlq/{huge}", f"/api/dlq/{huge}"):
        reply = call(server, "GET", path)
        assert reply.status == 404, (path, reply.status, reply.text[:300])
    sid, csrf = session(server, "/dlq")
    for action in ("/dlq/confirm", "/dlq/act"):
        posted = call(server, "POST", action, headers={"Cookie": f"ck_sid={sid}"},
                      form={"csrf": csrf, "verb": "replay", "ids": huge, "digest": "x",
                            "count": "1"})
        assert posted.status == 400, (action, posted.status, posted.text[:300])
        assert BLAMES_DATABASE not in posted.text


def test_a_dead_letter_age_before_year_one_is_a_400(server, seeded):
    for path in ("/api/dlq?older_than=99999999999d", "/dlq?newer_than=99999999999d",
                 "/api/dlq?older_than=900000d"):
        reply = call(server, "GET", path)
        assert reply.status == 400, (path, reply.status, reply.text[:300])
        assert "before year 1" in reply.text, reply.text[:300]
    cli = subprocess.run([CRONKEEPER, "dlq", "list", "--database-url", seeded.url, "--schema",
                          seeded.schema, "--older-than", "99999999999d"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "before year 1" in cli.stderr, cli.stderr


def test_control_characters_in_a_dead_letter_error_are_shown_escaped(server):
    listed = call(server, "GET", "/dlq?task=t.ctl")
    assert listed.status == 200
    assert "all good" in listed.text
    for raw, shown in (("\x1b", "\\x1b"), ("\r", "\\x0d"), ("\u202e", "\\u202e")):
        assert raw not in listed.text and shown in listed.text, shown
    sid, csrf = session(server, "/dlq")
    confirm = call(server, "POST", "/dlq/confirm", headers={"Cookie": f"ck_sid={sid}"},
                   form={"csrf": csrf, "verb": "discard", "task": "t.ctl"})
    assert confirm.status == 200 and "all good" in confirm.text
    assert "\x1b" not in confirm.text and "\u202e" not in confirm.text


def test_a_token_file_that_is_not_text_is_a_clear_start_error(tmp_path):
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe not utf-8")
    started = subprocess.run([CRONKEEPER, "web", "--address", "127.0.0.1:0", "--token-file",
                              str(token)], capture_output=True, text=True, timeout=60)
    assert started.returncode == 2, started.stderr
    assert f"--token-file {token}" in started.stderr and "UTF-8" in started.stderr
    assert "internal error" not in started.stderr and "Traceback" not in started.stderr


def test_a_page_behind_a_held_lock_answers_503_and_frees_its_thread(server, seeded):
    """A read waiting for a lock held for minutes (a migration's DDL) gives up after the
    statement limit (cli/web.py: STATEMENT_SECONDS) with a 503 that says why, instead of
    holding a request thread for as long as the lock is held; the page works once it is gone."""
    import http.client
    import time

    from cronkeeper.cli.web import STATEMENT_SECONDS

    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as locker:
        locker.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        conn = http.client.HTTPConnection("127.0.0.1", server.port,
                                          timeout=STATEMENT_SECONDS + 30)
        started = time.monotonic()
        conn.request("GET", "/api/dlq")
        reply = conn.getresponse()
        text = reply.read().decode()
        waited = time.monotonic() - started
        conn.close()
        locker.rollback()
    assert reply.status == 503, (reply.status, text[:300])
    assert BLAMES_DATABASE in text and "statement timeout" in text, text
    assert STATEMENT_SECONDS - 1 <= waited < STATEMENT_SECONDS + 20, waited
    assert call(server, "GET", "/api/dlq").status == 200
