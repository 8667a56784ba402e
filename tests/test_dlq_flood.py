"""More dead letters than one list holds (``operations.dlq.MAX_DOCUMENT``, 100,000): ``dlq list``
and ``/api/dlq`` refuse the whole selection, saying how many there are, and give a page when
asked for one (``--limit``/``--offset``, ``?limit=&offset=``), never a list cut short without a
word; ``dlq replay`` states and replays the whole selection, however many."""

from __future__ import annotations

import json
import subprocess

import psycopg
import pytest
from test_web_http import call
from web_seed import CRONKEEPER, WebServer, drop, libpq, seed

from cronkeeper.operations.dlq import MAX_DOCUMENT

FLOOD = MAX_DOCUMENT  # with the seed's 3 dead letters: 3 past the most one list holds
TOTAL = FLOOD + 3


@pytest.fixture(scope="module")
def seeded(database_url):
    s = seed(database_url)
    with psycopg.connect(libpq(s.url), options=f"-c search_path={s.schema}") as conn:
        conn.execute(
            "INSERT INTO outbox (idempotency_key, task, state, attempts, run_after, last_error, "
            "finished_at) SELECT 'flood-' || g, 'f.flood', 'dead', 5, now() - interval '2 hours', "
            "'ConnectionError: refused', now() - interval '1 hour' + g * interval '1 ms' "
            "FROM generate_series(1, %s) g", (FLOOD,))
    yield s
    drop(database_url, s.schema)


def cli(seeded, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CRONKEEPER, "dlq", *args, "--database-url", seeded.url, "--schema",
                           seeded.schema], capture_output=True, text=True, timeout=300)


def dead_ids(seeded) -> list[int]:
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as c:
        return [r[0] for r in c.execute(
            "SELECT id FROM outbox WHERE state = 'dead' ORDER BY finished_at, id").fetchall()]


def test_a_list_past_the_most_one_holds_is_refused_saying_how_many(seeded):
    listed = cli(seeded, "list", "--format", "json")
    assert listed.returncode == 2 and listed.stdout == "", listed.stdout[:300]
    assert f"selects {TOTAL} dead letters" in listed.stderr and "limit" in listed.stderr
    narrowed = cli(seeded, "list", "--format", "json", "--task", "t.other")
    assert narrowed.returncode == 0 and len(json.loads(narrowed.stdout)) == 2


def test_a_page_of_the_list_when_asked_for(seeded):
    ids = dead_ids(seeded)
    last = cli(seeded, "list", "--format", "json", "--limit", "10", "--offset", str(TOTAL - 4))
    assert last.returncode == 0, last.stderr
    assert [item["id"] for item in json.loads(last.stdout)] == ids[-4:]
    past = cli(seeded, "list", "--format", "json", "--offset", "5")  # the rest is few enough
    assert past.returncode == 0 and len(json.loads(past.stdout)) == TOTAL - 5


def test_the_json_mirror_refuses_or_pages_the_same(seeded, tmp_path):
    server = WebServer(seeded.url, seeded.schema, seeded.cluster, log=tmp_path / "web.log")
    try:
        whole = call(server, "GET", "/api/dlq")
        assert whole.status == 400 and f"selects {TOTAL} dead letters" in whole.text
        page = call(server, "GET", "/api/dlq?limit=3&offset=1")
        assert page.status == 200 and [i["id"] for i in json.loads(page.text)] == dead_ids(
            seeded)[1:4]
        assert page.text == cli(seeded, "list", "--format", "json", "--limit", "3",
                                "--offset", "1").stdout
        for bad in ("limit=0", "limit=abc", f"limit={MAX_DOCUMENT + 1}", "offset=-1"):
            assert call(server, "GET", f"/api/dlq?{bad}").status == 400, bad
        assert f"{TOTAL} dead letters" in call(server, "GET", "/dlq").text  # the page counts all
    finally:
        server.stop()


def test_replay_states_and_replays_the_whole_selection(seeded):
    replayed = cli(seeded, "replay", "--yes")
    assert replayed.returncode == 0, replayed.stderr
    assert f"replay {TOTAL} dead letters" in replayed.stdout
    assert f"replayed {TOTAL} jobs" in replayed.stdout
    assert dead_ids(seeded) == []
