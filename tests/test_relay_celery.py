"""The relay with a real ``celery worker`` process, real ``cronkeeper run`` and ``cronkeeper
relay`` processes, RabbitMQ and PostgreSQL: what docs/celery.md promises.

- every period of a 1-second schedule reaches the Celery worker exactly as often as the relay
  published it (two schedulers, one relay: the "Replacing celery beat" steps end to end);
- a relay SIGKILLed between publish and mark republishes with the same task id, and the dedupe
  recipe of docs/celery.md absorbs the second delivery;
- overlap = "skip" holds while a relayed job still runs on the Celery worker.
"""

from __future__ import annotations

import os
import signal

import psycopg
import pytest
import sqlalchemy as sa
from conftest import libpq_url, scalar
from daemon_harness import Daemon, assert_audit_clean, schedule_toml, set_path, write_schedules
from handlers_for_tests import wait_until
from relay_helpers import (
    AMQP_URL,
    REDIS_URL,
    celery_config,
    create_celery_tables,
    delete_amqp_queue,
    put,
    spawn_celery_worker,
    spawn_relay,
    stop,
    unique,
    write_config,
)


@pytest.fixture
def queue():
    name = unique("ck-celery-test")
    yield name
    delete_amqp_queue(name)


def _rows(engine, sql: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql)).all()]


def test_relay_killed_between_publish_and_mark_republishes_same_id_and_recipe_absorbs_it(
        engine, schema, database_url, queue, tmp_path):
    create_celery_tables(engine)
    key = "invoices@2026-03-08T07:00:00Z"
    put(engine, schema, "billing.record", {"invoice": 7}, key=key)
    config = write_config(tmp_path, celery_config(AMQP_URL, queue=queue, lease="2s"))
    celery = spawn_celery_worker(database_url, schema, queue)
    try:
        doomed = spawn_relay(database_url, schema, config, relay_id="relay-doomed",
                             kill_after_publish=1)
        assert doomed.wait(60) == -signal.SIGKILL, stop(doomed)
        # published (the Celery worker runs it) but never marked: the row is still the relay's
        assert scalar(engine, "SELECT state || ':' || leased_by FROM outbox") == "running:relay-doomed"
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM celery_deliveries") == 1,
                   timeout=60, message="first delivery")
        survivor = spawn_relay(database_url, schema, config, relay_id="relay-survivor")
        try:
            wait_until(lambda: scalar(engine, "SELECT state FROM outbox") == "published",
                       timeout=60, message="republished after the lease expired")
            wait_until(lambda: scalar(engine, "SELECT count(*) FROM celery_deliveries") == 2,
                       timeout=60, message="second delivery")
        finally:
            stop(survivor)
    finally:
        stop(celery)
    deliveries = _rows(engine, "SELECT task_id, key_header FROM celery_deliveries ORDER BY n")
    assert deliveries == [(key, key), (key, key)]  # the same task id both times
    assert _rows(engine, "SELECT key FROM invoices_sent") == [(key,)]  # the effect once
    attempts = _rows(engine, "SELECT attempt, worker_id, outcome FROM attempts ORDER BY attempt")
    assert attempts == [(1, "relay-doomed", "lease_expired"), (2, "relay-survivor", "published")]
    assert scalar(engine, "SELECT target_id FROM outbox") == key


def _doc_files() -> dict[str, str]:
    """The files docs/celery.md shows (```toml blocks starting with ``# file: NAME``)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "celery.md").read_text()
    found = {}
    for block in re.findall(r"```toml\n(.*?)```", text, re.S):
        first, _, rest = block.partition("\n")
        for marker in ("# file: ", "# add to "):
            if first.startswith(marker):
                found[marker + first[len(marker):].strip()] = rest
    return found


def test_replacing_celery_beat_as_documented(engine, schema, database_url, cluster, queue, tmp_path):
    """docs/celery.md's steps on a real Celery app with a beat_schedule: `cronkeeper import
    celery-beat` writes the files the page shows (compared as TOML data), the suggested relay
    config becomes relay.toml, `validate` passes, then one relay, two `cronkeeper run` and the
    unchanged Celery worker. Every period the schedulers emitted reaches the worker exactly
    once, under its key as task id, with the beat entry's kwargs."""
    import subprocess
    import tomllib

    from handlers_for_tests import cronkeeper_exe
    from relay_helpers import HERE, celery_env

    blocks = _doc_files()
    doc = {k.removeprefix("# file: "): v for k, v in blocks.items() if k.startswith("# file: ")}
    assert set(doc) == {"schedules/proj-celery-app.toml",
                        "schedules/proj-celery-app.relay.toml.example"}, blocks.keys()
    edit = blocks["# add to schedules/proj-celery-app.toml"]
    env = {**os.environ, **celery_env(database_url, schema, queue)}
    schedules = tmp_path / "schedules"
    imported = subprocess.run([cronkeeper_exe(), "import", "celery-beat", "celery_app_for_tests:app",
                               "--misfire", "catch_up", "-o", str(schedules)],
                              capture_output=True, text=True, env=env, cwd=str(HERE))
    assert imported.returncode == 0, imported.stderr
    stem = "celery_app_for_tests-app"
    written = {name: (schedules / name.replace("proj-celery-app", stem)).read_text()
               for name in ("proj-celery-app.toml", "proj-celery-app.relay.toml.example")}
    assert tomllib.loads(written["proj-celery-app.toml"]) == \
        tomllib.loads(doc["schedules/proj-celery-app.toml"])
    assert tomllib.loads(written["proj-celery-app.relay.toml.example"]) == tomllib.loads(
        doc["schedules/proj-celery-app.relay.toml.example"].replace("proj.celery:app",
                                                                     "celery_app_for_tests:app"))
    with open(schedules / f"{stem}.toml", "a") as fh:  # the page's edit (one table: append)
        fh.write("\n" + edit)
    config = tmp_path / "relay.toml"
    (schedules / f"{stem}.relay.toml.example").rename(config)
    os.chmod(schedules, 0o755)
    checked = subprocess.run([cronkeeper_exe(), "validate", "--relay-config", str(config),
                              str(schedules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    create_celery_tables(engine)
    celery = spawn_celery_worker(database_url, schema, queue)
    relay = spawn_relay(database_url, schema, str(config), env=env)
    daemons = [Daemon(url=database_url, schema=schema, cluster=cluster, schedules=schedules,
                      instance_id=f"vm{i}", log_dir=tmp_path).start() for i in (1, 2)]
    try:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox") >= 6, timeout=60,
                   message="six periods emitted")
        with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
            assert_audit_clean(set_path(conn, schema), context="while running")
        for d in daemons:
            d.stop()
        emitted = {r[0] for r in _rows(engine, "SELECT idempotency_key FROM outbox")}
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'published'")
                   == len(emitted), timeout=60, message="all published")
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM celery_deliveries") >= len(emitted),
                   timeout=60, message="all delivered")
    finally:
        for d in daemons:
            d.kill()
        relay_log = stop(relay)
        stop(celery)
    delivered = _rows(engine, "SELECT task_id, key_header, schedule_header FROM celery_deliveries")
    assert sorted(d[0] for d in delivered) == sorted(emitted), relay_log  # exactly once each
    assert all(d[0] == d[1] and d[2] == "tick" for d in delivered)
    assert scalar(engine, "SELECT count(*) FROM invoices_sent WHERE payload = "
                  "'{\"source\": \"beat\"}'::jsonb") == len(emitted)
    key = sorted(emitted)[0]
    story = subprocess.run([cronkeeper_exe(), "explain", key, "--database-url", database_url,
                            "--schema", schema], capture_output=True, text=True)
    assert story.returncode == 0, story.stderr
    assert "publication: to celery as " + key in story.stdout
    assert "final state: published" in story.stdout
    assert " published by " in story.stdout


def test_overlap_skip_holds_while_a_relayed_job_runs_on_the_celery_worker(
        engine, schema, database_url, cluster, queue, tmp_path):
    """A 1-second schedule with overlap = "skip" whose task takes 3 s on the Celery worker: the
    relay learns completion from the result backend (Redis), and until then every period is
    skipped (overlap); the next job is emitted only after the previous one finished."""
    import redis

    name = unique("slow")
    write_schedules(tmp_path / "schedules", {"slow.toml": schedule_toml(
        name, every="1s", overlap="skip", task="billing.slow", misfire="skip")})
    config = write_config(tmp_path, celery_config(
        AMQP_URL, queue=queue, tasks='["billing.*"]', target_extra=f'backend = "{REDIS_URL}"'))
    create_celery_tables(engine)
    celery = spawn_celery_worker(database_url, schema, queue, backend=REDIS_URL,
                                 env={"CK_TEST_SLOW_SECONDS": "3"})
    relay = spawn_relay(database_url, schema, config)
    daemon = Daemon(url=database_url, schema=schema, cluster=cluster,
                    schedules=tmp_path / "schedules", instance_id="vm1", log_dir=tmp_path).start()
    try:
        wait_until(lambda: scalar(engine, "SELECT count(*) FROM outbox WHERE state = 'succeeded'") >= 2,
                   timeout=90, message="two relayed jobs reported finished by the result backend")
        daemon.stop()
    finally:
        daemon.kill()
        relay_log = stop(relay)
        stop(celery)
        r = redis.Redis.from_url(REDIS_URL)
        for k in r.scan_iter(f"celery-task-meta-{name}@*"):
            r.delete(k)
    jobs = _rows(engine, "SELECT idempotency_key, created_at, finished_at, state FROM outbox "
                 "ORDER BY created_at")
    finished = [j for j in jobs if j[3] == "succeeded"]
    assert len(finished) >= 2, (jobs, relay_log)
    for before, after in zip(jobs, jobs[1:], strict=False):
        assert before[2] is not None and after[1] >= before[2], (before, after)  # never overlapping
    skipped = scalar(engine, "SELECT count(*) FROM periods WHERE reason = 'overlap'")
    assert skipped >= 2  # the periods while the job ran on the Celery worker
    runs = _rows(engine, "SELECT started_at, finished_at FROM celery_deliveries ORDER BY started_at")
    for (_, end), (start, _) in zip(runs, runs[1:], strict=False):
        assert start >= end
