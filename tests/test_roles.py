"""The least-privilege roles of docs/operations.md, exactly as written there, are enough: a
scheduler that may not DELETE leads, fires and prunes; a worker that may not run DDL works
jobs; and neither can do what the doc says it cannot. On the private PostgreSQL (roles are
cluster-wide, so the shared service is left alone)."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
from daemon_harness import (
    CRONKEEPER,
    Daemon,
    schedule_toml,
    shared_postgres,
    wait_for,
    write_schedules,
)
from notify_receivers import HttpReceiver

import cronkeeper

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def doc_sql_blocks() -> list[str]:
    text = DOC.read_text()
    section = text[text.index("## Least-privilege roles"):]
    section = section[: section.index("\n## ", 5)]
    return re.findall(r"```sql\n(.*?)```", section, flags=re.S)


@pytest.fixture
def roles():
    pg = shared_postgres()
    tag = uuid.uuid4().hex[:8]
    names = {"cronkeeper_owner": f"ck_owner_{tag}", "cronkeeper_scheduler": f"ck_sched_{tag}",
             "cronkeeper_worker": f"ck_worker_{tag}", "cronkeeper_reader": f"ck_reader_{tag}",
             "cronkeeper_app": f"ck_app_{tag}"}
    schema = f"ck_{tag}"

    def substitute(sql: str) -> str:
        for old, new in names.items():
            sql = sql.replace(old, new)
        return re.sub(r"\bcronkeeper\b(?=[.\s;]|$)", schema, sql)

    blocks = [substitute(b) for b in doc_sql_blocks()]
    assert len(blocks) == 2, "the doc has a block before migrating and one after"
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute(blocks[0])
    url = {role: pg.url.replace("postgres@", f"{name}@") for role, name in names.items()}
    yield pg, schema, url, blocks[1]
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for name in names.values():
            admin.execute(f'DROP OWNED BY "{name}"')
        for name in names.values():
            admin.execute(f'DROP ROLE "{name}"')


def test_scheduler_and_worker_run_under_the_documented_roles(roles, tmp_path):
    pg, schema, url, after_migrate = roles
    migrate = subprocess.run([CRONKEEPER, "migrate", "--database-url", url["cronkeeper_owner"],
                              "--schema", schema], capture_output=True, text=True, timeout=60)
    assert migrate.returncode == 0, migrate.stderr
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute(after_migrate)

    # an application defines a schedule at runtime under its own role (docs/runtime-schedules.md)
    with psycopg.connect(url["cronkeeper_app"]) as app:
        cronkeeper.schedules.put(app, "from-app", {
            "cron": "* * * * * *", "timezone": "UTC", "misfire": "skip", "task": "t.app",
            "overlap": "allow"}, schema=schema)
        app.commit()
    schedules = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("tick", cron="* * * * * *")})
    receiver = HttpReceiver()  # the worker's sender delivers its dead letters' notifications
    notify = tmp_path / "notify.toml"
    notify.write_text(f'[sinks.hook]\nkind = "webhook"\nurl = "{receiver.url}/hook"\n'
                      '[[rules]]\nsink = "hook"\n')
    scheduler = Daemon(url=url["cronkeeper_scheduler"], schema=schema, cluster="roles",
                       schedules=schedules, instance_id="sched", log_dir=tmp_path).start()
    worker_log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - the child owns it
    worker = subprocess.Popen(
        [CRONKEEPER, "worker", "--database-url", url["cronkeeper_worker"], "--schema", schema,
         "--schedules", str(schedules), "--metrics-address", "off", "--notify-config",
         str(notify)],
        stdout=worker_log, stderr=worker_log)
    try:
        with psycopg.connect(pg.url, options=f"-c search_path={schema}") as db:
            def count(sql):
                return db.execute(sql).fetchone()[0]
            wait_for(lambda: count("SELECT count(*) FROM periods") >= 3, 20, "the scheduler fires")
            wait_for(lambda: count("SELECT count(*) FROM periods WHERE schedule = 'from-app'"),
                     20, "the scheduler fires the runtime schedule")
            # the worker dead-letters them (no handler 't.tick' here): it updated jobs, attempts
            wait_for(lambda: count("SELECT count(*) FROM outbox WHERE state = 'dead'") >= 2, 30,
                     "the worker to work the jobs")
            # ... noted the first dead letter, and its sender delivered it
            wait_for(lambda: count("SELECT count(*) FROM notifications WHERE state = 'sent'"), 30,
                     "the worker's sender to deliver the dead notification")
            # one per dying schedule: the file's and the runtime one's
            wait_for(lambda: len(receiver.posts("/hook")) >= 2, 30, "both dead notifications")
            assert sorted((r.json()["event"], r.json()["schedule"])
                          for r in receiver.posts("/hook")) == [("dead", "from-app"),
                                                                ("dead", "tick")]
        assert scheduler.alive() and worker.poll() is None
        for text in (scheduler.log_text(), (tmp_path / "worker.log").read_text()):
            assert "permission denied" not in text, text[-3000:]
            assert "must be owner" not in text
    finally:
        scheduler.stop()
        worker.terminate()
        worker.wait(30)
        worker_log.close()
        receiver.close()

    # what the doc says they cannot do, they cannot do
    forbidden = [
        ("cronkeeper_scheduler", "DELETE FROM periods"),
        ("cronkeeper_worker", "CREATE TABLE intruder (x int)"),
        ("cronkeeper_worker", "SELECT * FROM prune(now(), now(), 1)"),
        ("cronkeeper_worker", "SELECT notifications_prune(now(), 1)"),
        ("cronkeeper_reader", "UPDATE notifications SET state = 'sent'"),
        ("cronkeeper_app", "DELETE FROM runtime_schedules"),
        ("cronkeeper_app", "SELECT * FROM outbox"),
        ("cronkeeper_app", "UPDATE schedule_versions SET digest = 'x'"),
    ]
    for role, statement in forbidden:
        with (
            psycopg.connect(url[role], options=f"-c search_path={schema}") as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(statement)


def test_web_reads_under_the_reader_role_and_cannot_act(roles, tmp_path):
    """`cronkeeper web` works under the documented read-only role; with --allow-actions its
    buttons meet the database's refusal, shown as a message, and nothing changes."""
    import http.client
    import re as _re

    from web_seed import Seeder, WebServer, spec

    pg, schema, url, after_migrate = roles
    migrate = subprocess.run([CRONKEEPER, "migrate", "--database-url", url["cronkeeper_owner"],
                              "--schema", schema], capture_output=True, text=True, timeout=60)
    assert migrate.returncode == 0, migrate.stderr
    with psycopg.connect(pg.url, autocommit=True) as admin:
        admin.execute(after_migrate)
    with psycopg.connect(url["cronkeeper_owner"], options=f"-c search_path={schema}") as conn:
        s = Seeder(conn)
        now = s.now()
        v = s.version(spec("tick", every=60), "tick", now.replace(second=0, microsecond=0))
        s.period("tick", v, now.replace(second=0, microsecond=0), "emitted",
                 job=("dead", 1, "boom"))
        conn.commit()

    def get(server, path, headers=None, form=None):
        c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = None if form is None else "&".join(f"{k}={v}" for k, v in form.items())
        hdrs = dict(headers or {})
        if form is not None:
            hdrs["Content-Type"] = "application/x-www-form-urlencoded"
        c.request("POST" if form is not None else "GET", path, body=body, headers=hdrs)
        r = c.getresponse()
        return r.status, r.headers, r.read().decode()

    reader = url["cronkeeper_reader"]
    server = WebServer(reader, schema, "roles", "--allow-actions", log=tmp_path / "web.log")
    try:
        for path in ("/", "/schedules/tick", "/instances", "/queue", "/dlq", "/api/status",
                     "/api/history", "/api/dlq"):
            status, _, text = get(server, path)
            assert status == 200, (path, text[-500:])
        assert 'data-state="dead"' in get(server, "/")[2]
        status, headers, text = get(server, "/schedules/tick")
        sid = _re.search(r"ck_sid=([0-9a-f]+)", headers["Set-Cookie"]).group(1)
        csrf = _re.search(r'name="csrf" value="([0-9a-f]+)"', text).group(1)
        status, _, text = get(server, "/schedules/tick/pause", {"Cookie": f"ck_sid={sid}"},
                              {"csrf": csrf})
        assert status == 503 and "permission denied" in text.lower(), text[-800:]
    finally:
        server.stop()
    with psycopg.connect(url["cronkeeper_owner"], options=f"-c search_path={schema}") as conn:
        assert conn.execute("SELECT count(*) FROM schedule_controls").fetchone()[0] == 0
    with (psycopg.connect(reader, options=f"-c search_path={schema}") as conn,
          pytest.raises(psycopg.errors.InsufficientPrivilege)):
        conn.execute("UPDATE outbox SET state = 'available'")
