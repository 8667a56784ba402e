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
             "cronkeeper_worker": f"ck_worker_{tag}"}
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

    schedules = write_schedules(tmp_path / "s", {"a.toml": schedule_toml("tick", cron="* * * * * *")})
    scheduler = Daemon(url=url["cronkeeper_scheduler"], schema=schema, cluster="roles",
                       schedules=schedules, instance_id="sched", log_dir=tmp_path).start()
    worker_log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 - the child owns it
    worker = subprocess.Popen(
        [CRONKEEPER, "worker", "--database-url", url["cronkeeper_worker"], "--schema", schema,
         "--schedules", str(schedules), "--metrics-address", "off"],
        stdout=worker_log, stderr=worker_log)
    try:
        with psycopg.connect(pg.url, options=f"-c search_path={schema}") as db:
            def count(sql):
                return db.execute(sql).fetchone()[0]
            wait_for(lambda: count("SELECT count(*) FROM periods") >= 3, 20, "the scheduler fires")
            # the worker dead-letters them (no handler 't.tick' here): it updated jobs, attempts
            wait_for(lambda: count("SELECT count(*) FROM outbox WHERE state = 'dead'") >= 2, 30,
                     "the worker to work the jobs")
        assert scheduler.alive() and worker.poll() is None
        for text in (scheduler.log_text(), (tmp_path / "worker.log").read_text()):
            assert "permission denied" not in text, text[-3000:]
            assert "must be owner" not in text
    finally:
        scheduler.stop()
        worker.terminate()
        worker.wait(30)
        worker_log.close()

    # what the doc says they cannot do, they cannot do
    forbidden = [
        ("cronkeeper_scheduler", "DELETE FROM periods"),
        ("cronkeeper_worker", "CREATE TABLE intruder (x int)"),
        ("cronkeeper_worker", "SELECT * FROM prune(now(), now(), 1)"),
    ]
    for role, statement in forbidden:
        with (
            psycopg.connect(url[role], options=f"-c search_path={schema}") as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(statement)
