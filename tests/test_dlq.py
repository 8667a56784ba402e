"""cronkeeper dlq: list, show, replay and discard; replay and discard ask, every time."""

from __future__ import annotations

import json
import subprocess

from handlers_for_tests import cronkeeper_exe

import cronkeeper


def cli(database_url, schema, *args, stdin=subprocess.DEVNULL):
    return subprocess.run([cronkeeper_exe(), "dlq", *args, "--database-url", database_url,
                           "--schema", schema], capture_output=True, text=True, stdin=stdin, timeout=60)


def dead_letters(engine, schema, n=3):
    with engine.begin() as conn:
        for i in range(n):
            cronkeeper.enqueue(conn, "billing.charge" if i % 2 else "mail.send", {"i": i},
                               key=f"dead:{i}", schema=schema)
        conn.exec_driver_sql("UPDATE outbox SET state = 'dead', attempts = 5, finished_at = now(), "
                             "last_error = 'TimeoutError: 503'")
        conn.exec_driver_sql("INSERT INTO attempts (job_id, attempt, worker_id, started_at, finished_at, "
                             "outcome, error) SELECT id, 5, 'w', now(), now(), 'dead', 'x' FROM outbox")


def states(engine):
    with engine.connect() as conn:
        return dict(conn.exec_driver_sql("SELECT idempotency_key, state FROM outbox").all())


def test_list_json(engine, schema, database_url):
    dead_letters(engine, schema)
    out = cli(database_url, schema, "list", "--format", "json")
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)
    assert [set(i) for i in items] == [{"id", "idempotency_key", "schedule", "task", "attempts",
                                        "last_error", "dead_at"}] * 3
    assert items[0]["attempts"] == 5 and items[0]["last_error"] == "TimeoutError: 503"
    only = json.loads(cli(database_url, schema, "list", "--task", "mail.send", "--format", "json").stdout)
    assert {i["idempotency_key"] for i in only} == {"dead:0", "dead:2"}
    assert json.loads(cli(database_url, schema, "list", "--older-than", "1h", "--format", "json").stdout) == []


def test_show(engine, schema, database_url):
    dead_letters(engine, schema, 1)
    job = json.loads(cli(database_url, schema, "list", "--format", "json").stdout)[0]["id"]
    out = cli(database_url, schema, "show", str(job), "--format", "json")
    assert json.loads(out.stdout)["payload"] == {"i": 0}
    assert cli(database_url, schema, "show", "999999").returncode == 1


def test_replay_without_yes_and_without_terminal_changes_nothing(engine, schema, database_url):
    dead_letters(engine, schema)
    for verb in ("replay", "discard"):
        out = cli(database_url, schema, verb)
        assert out.returncode != 0
        assert "3 dead letters" in out.stdout and "billing.charge (1)" in out.stdout
        assert "--yes" in out.stderr and "Traceback" not in out.stderr
        assert set(states(engine).values()) == {"dead"}


def test_replay_with_yes_resets_attempts_and_keeps_history(engine, schema, database_url):
    dead_letters(engine, schema)
    out = cli(database_url, schema, "replay", "--task", "billing.charge", "--yes")
    assert out.returncode == 0, out.stderr
    assert "replayed 1 job" in out.stdout
    assert states(engine)["dead:1"] == "available"
    with engine.connect() as conn:
        row = conn.exec_driver_sql("SELECT attempts, run_after <= now() FROM outbox "
                                   "WHERE idempotency_key = 'dead:1'").one()
        kept = conn.exec_driver_sql("SELECT a.attempt FROM attempts a JOIN outbox o ON o.id = a.job_id "
                                    "WHERE o.idempotency_key = 'dead:1'").all()
    assert tuple(row) == (0, True)
    assert kept == [(-5,)]


def test_discard_with_yes(engine, schema, database_url):
    dead_letters(engine, schema)
    out = cli(database_url, schema, "discard", "--task", "mail.send", "--yes")
    assert out.returncode == 0 and "discarded 2 jobs" in out.stdout
    assert states(engine) == {"dead:1": "dead"}


def test_replay_and_discard_take_ids_as_arguments(engine, schema, database_url):
    """Issue 9 §4: `dlq replay 42` failed with "unexpected extra argument"."""
    dead_letters(engine, schema)
    ids = {i["idempotency_key"]: i["id"] for i in json.loads(
        cli(database_url, schema, "list", "--format", "json").stdout)}
    out = cli(database_url, schema, "replay", str(ids["dead:0"]), "--yes")
    assert out.returncode == 0, out.stderr
    assert "replayed 1 job" in out.stdout
    assert states(engine) == {"dead:0": "available", "dead:1": "dead", "dead:2": "dead"}
    # positional and --id together, and a repeated id counted once
    out = cli(database_url, schema, "discard", str(ids["dead:1"]), "--id", str(ids["dead:2"]),
              str(ids["dead:1"]), "--yes")
    assert out.returncode == 0, out.stderr
    assert "discarded 2 jobs" in out.stdout
    assert states(engine) == {"dead:0": "available"}
    bad = cli(database_url, schema, "replay", "forty-two", "--yes")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
