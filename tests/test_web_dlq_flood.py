"""`/dlq` in a dead-letter flood, over real HTTP against a real server process: the page shows
the whole selection's count and one page of its rows (100, oldest first, with links to the
others); "Replay these N" confirms the whole filtered selection (its count, its tasks, a sample
of its rows) and acts on exactly that selection; a dead letter that joins or leaves the
selection between the confirmation and the act makes the act refuse, changing nothing."""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta

import psycopg
import pytest
from test_web_http import call, session
from web_seed import Seeder, WebServer, drop, libpq, seed

ROWS = re.compile(r'<tr data-id="(\d+)"')
HIDDEN = re.compile(r'<input type="hidden" name="(\w+)" value="([^"]*)">')
FLOOD = {"f.a": 200, "f.b": 100}  # with the seed's 3 dead letters: 303


@pytest.fixture(scope="module")
def seeded(database_url):
    s = seed(database_url)
    with psycopg.connect(libpq(s.url), options=f"-c search_path={s.schema}") as conn:
        seeder = Seeder(conn)
        start = seeder.now() - timedelta(hours=2)
        for i in range(sum(FLOOD.values())):
            # interleaved tasks, each dying a second after the one before
            seeder.job(f"flood-{i}", None, start + timedelta(seconds=i), None, "dead", 5,
                       f"ConnectionError {i}\n" + "output line\n" * 100,
                       task="f.a" if i % 3 else "f.b")
    yield s
    drop(database_url, s.schema)


@pytest.fixture(scope="module")
def server(seeded, tmp_path_factory):
    started = WebServer(seeded.url, seeded.schema, seeded.cluster, "--allow-actions",
                        log=tmp_path_factory.mktemp("web-dlq-flood") / "web.log")
    yield started
    started.stop()


def dead(seeded, task: str | None = None) -> list[int]:
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as c:
        return [r[0] for r in c.execute(
            "SELECT id FROM outbox WHERE state = 'dead' AND (%(t)s::text IS NULL OR task = %(t)s) "
            "ORDER BY finished_at, id", {"t": task}).fetchall()]


def confirm(server, verb: str, **filters: str):
    sid, csrf = session(server, "/dlq")
    cookie = {"Cookie": f"ck_sid={sid}"}
    reply = call(server, "POST", "/dlq/confirm", headers=cookie,
                 form={"csrf": csrf, "verb": verb, **filters})
    return reply, cookie


def act(server, confirmed, cookie, count: str):
    text = confirmed if isinstance(confirmed, str) else confirmed.text
    form = {k: html.unescape(v) for k, v in HIDDEN.findall(text.split('action="/dlq/act"', 1)[1])}
    return call(server, "POST", "/dlq/act", headers=cookie, form={**form, "count": count})


def _digest(reply) -> str:
    return dict(HIDDEN.findall(reply.text))["digest"]


def test_the_page_shows_the_whole_count_and_one_page_of_rows(server, seeded):
    everything = dead(seeded)
    page = call(server, "GET", "/dlq")
    assert page.status == 200
    assert "303 dead letters" in page.text and "f.a (200), f.b (100)" in page.text
    assert "Replay these 303" in page.text
    shown = [int(i) for i in ROWS.findall(page.text)]
    assert shown == everything[:100]  # the oldest hundred, oldest first
    assert "1–100 of 303" in page.text and 'rel="next" href="/dlq?page=2"' in page.text
    seen = list(shown)
    for n in (2, 3, 4):
        seen += [int(i) for i in ROWS.findall(call(server, "GET", f"/dlq?page={n}").text)]
    assert seen == everything  # every page once, in order, nothing left out
    last = call(server, "GET", "/dlq?page=4")
    assert 'rel="next"' not in last.text and 'rel="prev" href="/dlq?page=3"' in last.text


def test_a_filter_pages_too_and_keeps_its_filter_in_the_links(server, seeded):
    page = call(server, "GET", "/dlq?task=f.a&page=2")
    assert "200 dead letters: f.a (200)" in page.text and "Replay these 200" in page.text
    assert [int(i) for i in ROWS.findall(page.text)] == dead(seeded, "f.a")[100:200]
    assert 'href="/dlq?page=1&amp;task=f.a"' in page.text
    assert 'href="/api/dlq?task=f.a"' in page.text


def test_the_json_mirror_still_lists_the_whole_selection(server, seeded):
    reply = call(server, "GET", "/api/dlq?task=f.b")
    assert reply.status == 200 and reply.text.count('"idempotency_key"') == 100


def test_a_dead_letter_joining_the_selection_after_confirmation_refuses_the_act(server, seeded):
    confirmed, cookie = confirm(server, "discard", task="f.b")
    assert confirmed.status == 200 and "discard 100 dead letters" in confirmed.text
    before = dead(seeded)
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as c:
        Seeder(c).job("late-f.b", None, None, None, "dead", 1, "late", task="f.b")
    refused = act(server, confirmed, cookie, "100")
    assert refused.status == 409 and "selection changed" in refused.text
    assert "discard 101 dead letters" in refused.text  # the refusal states the new selection
    assert set(before) <= set(dead(seeded))  # nothing was done
    # a forged digest is refused the same way
    bad = act(server, refused.text.replace(_digest(refused), "0" * 64), cookie, "101")
    assert bad.status == 409 and len(dead(seeded, "f.b")) == 101
    # confirmed again, the new selection is discarded, and nothing else
    done = act(server, refused, cookie, "101")
    assert done.status == 200 and "Discarded 101 jobs" in done.text
    assert dead(seeded, "f.b") == [] and len(dead(seeded)) == len(before) - 100


def test_replay_all_confirms_the_count_and_a_sample_and_replays_exactly_those(server, seeded):
    chosen = dead(seeded, "f.a")
    others = [i for i in dead(seeded) if i not in set(chosen)]
    confirmed, cookie = confirm(server, "replay", task="f.a", older_than="1m")
    assert confirmed.status == 200
    # the age is carried as the instant it meant at confirmation, so the act selects the same
    fields = dict(HIDDEN.findall(confirmed.text))
    assert datetime.fromisoformat(fields["dead_before"]).tzinfo and "older_than" not in fields
    assert "replay 200 dead letters" in confirmed.text and "f.a</code> (200)" in confirmed.text
    assert [int(i) for i in ROWS.findall(confirmed.text)] == chosen[:20]
    assert "180 more are in the selection" in confirmed.text
    wrong = act(server, confirmed, cookie, "20")
    assert wrong.status == 422 and "exact count, 200" in wrong.text and dead(seeded, "f.a") == chosen
    done = act(server, confirmed, cookie, "200")
    assert done.status == 200 and "Replayed 200 jobs" in done.text
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as c:
        states = dict(c.execute("SELECT id, state FROM outbox WHERE id = ANY(%s)",
                                (chosen + others,)).fetchall())
    assert {states[i] for i in chosen} == {"available"}
    assert {states[i] for i in others} == {"dead"}  # only those
    again = act(server, confirmed, cookie, "200")  # the same confirmation, sent twice
    assert again.status == 409 and dead(seeded) == others
