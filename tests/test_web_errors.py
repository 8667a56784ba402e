"""A page's internal error (a bug) is logged with its traceback once, then once a minute while
it recurs on that page, with how many (SPEC §10: what is wrong, not a flood): a dashboard
refreshing a broken page wrote a traceback per request. The page still answers 500 each time.
The real application on a real database; the bug is made by replacing the status read."""

from __future__ import annotations

import logging

from cronkeeper.db.engine import make_engine, normalize_url, redact
from cronkeeper.operations import status as cluster_status
from cronkeeper.web.app import Context, wsgi
from cronkeeper.web.pages import VersionsCache
from cronkeeper.web.security import WebConfig

HOST = {"Host": "127.0.0.1"}


def test_a_page_failing_on_every_request_logs_its_traceback_once(database_url, schema, caplog,
                                                                 monkeypatch):
    def broken(*args: object, **kwargs: object) -> dict:
        raise KeyError(f"a bug, with a different message each time {len(caplog.records)}")

    engine = make_engine(normalize_url(database_url), schema)
    try:
        client = wsgi(Context(engine, schema, "default", redact(normalize_url(database_url)),
                              WebConfig.make("127.0.0.1", 9480, None, False),
                              VersionsCache())).test_client()
        assert client.get("/api/status", headers=HOST).status_code == 200
        monkeypatch.setattr(cluster_status, "gather", broken)
        with caplog.at_level(logging.ERROR, logger="cronkeeper.web"):
            answers = [client.get("/api/status", headers=HOST) for _ in range(20)]
            instances = client.get("/instances", headers=HOST)  # another page: said apart
    finally:
        engine.dispose()
    assert {a.status_code for a in answers} == {500}
    assert "internal error (KeyError)" in answers[-1].get_data(as_text=True)
    assert instances.status_code == 500
    said = [r for r in caplog.records if getattr(r, "action", None) == "web_error"]
    assert len(said) == 2, [r.getMessage() for r in said]
    assert "GET /api/status: KeyError" in said[0].getMessage()
    assert "GET /instances: KeyError" in said[1].getMessage()
    assert all(r.exc_info is not None for r in said)  # each with its traceback, the first time
