"""cronkeeper.schedules: runtime schedules in the caller's transaction (SQLAlchemy or psycopg),
validated as `cronkeeper validate` validates files, all or nothing (SPEC §15)."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

import cronkeeper
from cronkeeper import schedules
from cronkeeper.db.schedule_versions import versions_insert
from cronkeeper.errors import DatabaseError, ScheduleError, UsageError

SPEC = {"cron": "*/5 * * * *", "timezone": "UTC", "misfire": "skip", "task": "reports.daily",
        "payload": {"tenant": 1}, "owner": "team-reports"}


def plain(database_url: str) -> str:
    return database_url.replace("postgresql+psycopg://", "postgresql://")


def rows(engine, sql="SELECT name, version_id, deleted_at IS NOT NULL FROM runtime_schedules"
         " ORDER BY name"):
    with engine.connect() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(sql).all()]


def test_put_through_sqlalchemy_commits_with_the_caller_and_rollback_leaves_nothing(engine, schema):
    with engine.begin() as conn:
        version = schedules.put(conn, "tenant-1.report", SPEC, schema=schema)
    assert isinstance(version, int)
    with engine.connect() as conn:
        schedules.put(conn, "tenant-2.report", SPEC, schema=schema)
        conn.rollback()
    assert rows(engine) == [("tenant-1.report", version, False)]
    with engine.connect() as conn:
        assert schedules.get(conn, "tenant-1.report", schema=schema) == SPEC
        assert schedules.get(conn, "tenant-2.report", schema=schema) is None


def test_put_through_psycopg_commits_with_the_caller(engine, schema, database_url):
    with psycopg.connect(plain(database_url)) as conn:
        first = schedules.put(conn, "a", SPEC, schema=schema)
        conn.commit()
        schedules.put(conn, "b", SPEC, schema=schema)
        assert schedules.delete(conn, "a", schema=schema) is True
        conn.rollback()
    assert rows(engine) == [("a", first, False)]


def test_an_unchanged_put_writes_nothing_and_returns_the_current_id(engine, schema):
    with engine.begin() as conn:
        first = schedules.put(conn, "a", SPEC, schema=schema)
    before = rows(engine, "SELECT name, xmin::text, xid::text, updated_at FROM runtime_schedules")
    with engine.begin() as conn:
        assert schedules.put(conn, "a", dict(SPEC), schema=schema) == first
    assert rows(engine, "SELECT name, xmin::text, xid::text, updated_at FROM runtime_schedules") == before
    with engine.begin() as conn:
        changed = schedules.put(conn, "a", {**SPEC, "cron": "0 * * * *"}, schema=schema)
    assert changed > first
    assert rows(engine) == [("a", changed, False)]


def test_a_bad_spec_lists_every_problem_and_writes_nothing(engine, schema):
    bad = {"cron": "61 * * * *", "timezone": "Mars/Base", "misfire": "sometimes",
           "tsak": "x", "task": "t"}
    with engine.begin() as conn, pytest.raises(ScheduleError) as err:
        schedules.put_many(conn, {"good": SPEC, "bad": bad, "Bad Name": SPEC}, schema=schema)
    problems = err.value.problems
    messages = [p["message"] for p in problems if p["schedule"] == "bad"]
    assert any("did you mean 'task'?" in m for m in messages), messages
    assert any("timezone" in m for m in messages)
    assert any("misfire" in m for m in messages)
    assert any("cron" in m or "61" in m for m in messages)
    assert any(p["schedule"] == "Bad Name" for p in problems)
    assert all(set(p) == {"schedule", "message"} for p in problems)
    assert rows(engine) == []  # 'good' was not written either: all or nothing


def test_the_messages_are_validates_own(engine, schema, tmp_path):
    """The same spec in a file: `cronkeeper validate` prints the very messages put raises."""
    bad = {"every": "90x", "timezone": "UTC", "misfire": "catch_up", "task": "t",
           "owner": "o", "graec": "1m"}
    (tmp_path / "s.toml").write_text(
        '[x]\nevery = "90x"\ntimezone = "UTC"\nmisfire = "catch_up"\ntask = "t"\n'
        'owner = "o"\ngraec = "1m"\n')
    out = subprocess.run([str(Path(sys.executable).with_name("cronkeeper")), "validate",
                          "--format", "json", str(tmp_path)], capture_output=True, text=True)
    import json
    from_file = sorted(e["message"] for e in json.loads(out.stdout)["errors"])
    with engine.begin() as conn, pytest.raises(ScheduleError) as err:
        schedules.put(conn, "x", bad, schema=schema)
    assert sorted(p["message"] for p in err.value.problems) == from_file
    assert len(from_file) == 2


def test_command_is_refused(engine, schema):
    with engine.begin() as conn, pytest.raises(ScheduleError) as err:
        schedules.put(conn, "backup", {**{k: v for k, v in SPEC.items() if k != "task"},
                                       "command": ["/bin/true"]}, schema=schema)
    assert [p["message"] for p in err.value.problems] == [
        "'command' is not accepted at runtime: argv comes only from the schedule files on the "
        "workers; define this schedule in a file, or give a 'task'"]
    assert rows(engine) == []


def test_not_json_and_not_a_mapping_are_problems_not_tracebacks(engine, schema):
    with engine.begin() as conn, pytest.raises(ScheduleError) as err:
        schedules.put_many(conn, {"a": {**SPEC, "payload": {"when": datetime.now(UTC)}},
                                  "b": ["cron"], 3: SPEC}, schema=schema)
    assert {p["schedule"] for p in err.value.problems} == {"a", "b", "3"}
    with engine.begin() as conn, pytest.raises(UsageError):
        schedules.put_many(conn, [("a", SPEC)], schema=schema)  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        schedules.put(object(), "a", SPEC, schema=schema)


def test_keys_that_are_not_strings_and_nul_characters_are_problems(engine, schema):
    """A spec's key that is not a string raised TypeError from the did-you-mean; a NUL in a
    string raised DatabaseError ("unsupported Unicode escape sequence"), aborting the caller's
    transaction."""
    with engine.begin() as conn, pytest.raises(ScheduleError) as err:
        schedules.put_many(conn, {"a": {**SPEC, 1: "x"}, "b": {**SPEC, "owner": "o\x00"},
                                  "c": {**SPEC, "payload": {"k": "a\x00b"}}}, schema=schema)
    messages = {p["schedule"]: p["message"] for p in err.value.problems}
    assert messages["a"] == "a key must be a string, not an integer (1)"
    assert "NUL" in messages["b"] and "'owner'" in messages["b"]
    assert "NUL" in messages["c"] and "'payload.k'" in messages["c"]
    assert rows(engine) == []


def test_arguments_of_the_wrong_type_are_usage_errors_and_the_transaction_goes_on(engine, schema,
                                                                                 database_url):
    """A schema that is not a string raised TypeError from the pattern match (enqueue's too);
    ``get(conn, 5)`` and ``list(conn, 5)`` reached the database, whose error aborted the
    caller's transaction. Each is now a UsageError before any statement, so the application's
    transaction is still usable after it."""
    with psycopg.connect(plain(database_url)) as conn:
        calls = {
            "put": lambda: schedules.put(conn, "a", SPEC, schema=5),  # type: ignore[arg-type]
            "enqueue": lambda: cronkeeper.enqueue(conn, "t", {}, key="k",
                                                  schema=5),  # type: ignore[arg-type]
            "get": lambda: schedules.get(conn, 5, schema=schema),  # type: ignore[arg-type]
            "list": lambda: schedules.list(conn, 5, schema=schema),  # type: ignore[arg-type]
        }
        said = {}
        for what, call in calls.items():
            with pytest.raises(UsageError) as err:
                call()
            said[what] = str(err.value)
        assert said["put"].startswith("invalid schema name 5") and "enqueue" not in said["put"]
        assert said["enqueue"].startswith("invalid schema name 5")
        assert said["get"] == "get: name must be a string, not int"
        assert said["list"] == "list: prefix must be a string, not int"
        schedules.put(conn, "a", SPEC, schema=schema)  # the transaction was not aborted
        assert schedules.get(conn, "a", schema=schema) == SPEC


def test_delete_tombstones_and_a_new_put_revives_as_a_new_incarnation(engine, schema):
    with engine.begin() as conn:
        first = schedules.put(conn, "a", SPEC, schema=schema)
        assert schedules.delete(conn, "a", schema=schema) is True
        assert schedules.delete(conn, "a", schema=schema) is False
        assert schedules.delete(conn, "nothing", schema=schema) is False
    assert rows(engine) == [("a", first, True)]
    with engine.begin() as conn:
        assert schedules.get(conn, "a", schema=schema) is None
        assert schedules.list(conn, schema=schema) == {}
        again = schedules.put(conn, "a", SPEC, schema=schema)  # the same spec: a new schedule
    assert again > first
    assert rows(engine, "SELECT version_id, incarnation, deleted_at FROM runtime_schedules") == [
        (again, again, None)]


def test_sync_makes_the_prefix_exactly_the_mapping(engine, schema):
    with engine.begin() as conn:
        schedules.put_many(conn, {"t1.a": SPEC, "t1.b": SPEC, "t2.a": SPEC}, schema=schema)
    with engine.begin() as conn:
        ids = schedules.sync(conn, {"t1.b": {**SPEC, "owner": "x"}, "t1.c": SPEC},
                             prefix="t1.", schema=schema)
    assert set(ids) == {"t1.b", "t1.c"}
    with engine.connect() as conn:
        assert schedules.list(conn, schema=schema) == {
            "t1.b": {**SPEC, "owner": "x"}, "t1.c": SPEC, "t2.a": SPEC}
        assert set(schedules.list(conn, "t1.", schema=schema)) == {"t1.b", "t1.c"}
    with engine.begin() as conn, pytest.raises(ScheduleError) as err:
        schedules.sync(conn, {"t2.z": SPEC}, prefix="t1.", schema=schema)
    assert "does not start with the prefix 't1.'" in err.value.problems[0]["message"]
    with engine.begin() as conn:
        schedules.sync(conn, {}, prefix="t1.", schema=schema)
    with engine.connect() as conn:
        assert set(schedules.list(conn, schema=schema)) == {"t2.a"}


def test_a_file_schedules_name_is_refused_both_for_put_and_delete(engine, schema):
    with engine.connect() as conn:
        from cronkeeper.db.engine import driver
        raw = driver(conn)
        raw.execute(f'SET search_path = "{schema}"')
        versions_insert(raw, [("nightly", "d", {"task": "t"})], datetime.now(UTC), 1,
                        origins=["file:/etc/cronkeeper/billing.toml"])
        versions_insert(raw, [("old", "d", {"task": "t"})], datetime.now(UTC), 1)
        raw.commit()
    for name, where in (("nightly", "/etc/cronkeeper/billing.toml"), ("old", "the schedule files")):
        with engine.begin() as conn, pytest.raises(ScheduleError) as err:
            schedules.put(conn, name, SPEC, schema=schema)
        assert err.value.problems == [{"schedule": name, "message": (
            f"the name is held by a file schedule ({where}); names are one namespace across "
            "files and runtime: choose another name, or remove it from the files first")}]
        with engine.begin() as conn, pytest.raises(ScheduleError, match=where):
            schedules.delete(conn, name, schema=schema)
    assert rows(engine) == []


def test_two_transactions_creating_one_name_one_wins_the_other_is_told(engine, schema, database_url):
    with psycopg.connect(plain(database_url)) as a, psycopg.connect(plain(database_url)) as b:
        schedules.put(a, "race", SPEC, schema=schema)
        b.execute("SET lock_timeout = '100ms'")
        with pytest.raises(DatabaseError):
            schedules.put(b, "race", {**SPEC, "owner": "b"}, schema=schema)
        a.commit()
    assert [r[0] for r in rows(engine)] == ["race"]


def test_puts_and_syncs_of_overlapping_names_wait_for_each_other_not_deadlock(
        engine, schema, database_url):
    """Each put (and sync, and delete) locks the rows it changes in name order, so concurrent
    applications changing overlapping names wait for one another; they used to meet
    "deadlock detected" (a DatabaseError), most of the time, as each locked in its own order."""
    names = [f"t-{i:04}" for i in range(1000)]
    with psycopg.connect(plain(database_url)) as c:
        schedules.put_many(c, {n: SPEC for n in names}, schema=schema)
        c.commit()
    failed: list[str] = []

    def change(seed: int) -> None:
        rng = random.Random(seed)
        for round_ in range(4):
            some = rng.sample(names, len(names) // 2)
            spec = {**SPEC, "owner": f"o-{seed}-{round_}"}
            try:
                with psycopg.connect(plain(database_url)) as c:
                    if round_ % 2:
                        schedules.sync(c, {n: spec for n in some}, prefix="t-", schema=schema)
                    else:
                        schedules.put_many(c, {n: spec for n in some}, schema=schema)
                    c.commit()
            except DatabaseError as exc:
                failed.append(str(exc))

    threads = [threading.Thread(target=change, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failed == []


def test_cronkeeper_exports_the_api_lazily():
    code = ("import cronkeeper, sys; assert 'psycopg' not in sys.modules; "
            "from cronkeeper import schedules; print(cronkeeper.ScheduleError.__name__, "
            "schedules.put.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ScheduleError", "put"]
    assert cronkeeper.schedules is schedules


def test_the_fence_sees_an_uncommitted_delete_and_no_put(engine, schema, database_url):
    """The claim's fence (runtime_fence, FOR KEY SHARE SKIP LOCKED): a delete in flight hides
    the row from it without making it wait; a change in flight does not; and a delete waits
    for a claim that holds the row (migration 0015: deleted_at is a key column)."""
    from cronkeeper.db.runtime_schedules import runtime_fence

    with engine.begin() as conn:
        ids = schedules.put_many(conn, {"a": SPEC, "b": SPEC}, schema=schema)
    with psycopg.connect(plain(database_url)) as app_conn, \
            psycopg.connect(plain(database_url), autocommit=True) as leader:
        leader.execute(f'SET search_path = "{schema}"')
        schedules.delete(app_conn, "a", schema=schema)  # uncommitted
        schedules.put(app_conn, "b", {**SPEC, "owner": "changed"}, schema=schema)  # uncommitted
        with leader.transaction():
            assert runtime_fence(leader, ["a", "b"]) == {"b": ids["b"]}
        app_conn.commit()
        with leader.transaction():
            assert runtime_fence(leader, ["a", "b"]) == {"b": ids["b"]}
        # a claim holding the fence: a delete waits for it (here: times out)
        with leader.transaction():
            runtime_fence(leader, ["b"])
            app_conn.execute("SET lock_timeout = '200ms'")
            with pytest.raises(DatabaseError, match="lock timeout"):
                schedules.delete(app_conn, "b", schema=schema)
            app_conn.rollback()
            # ... while a change of it goes through
            schedules.put(app_conn, "b", {**SPEC, "owner": "again"}, schema=schema)
            app_conn.commit()


def test_a_spec_names_a_calendar_the_leader_recorded_from_the_files(engine, schema):
    from cronkeeper.db.calendars import calendars_record
    from cronkeeper.db.engine import driver

    with engine.connect() as conn:
        raw = driver(conn)
        raw.execute(f'SET search_path = "{schema}"')
        assert calendars_record(raw, [("holidays", ["2026-12-25", "2026-12-26"], "file:/s/h.toml"),
                                      ("old", ["2026-01-01"], "file:/s/h.toml")], 1) == (2, 0)
        assert calendars_record(raw, [("holidays", ["2026-12-25", "2026-12-26"],
                                       "file:/s/h.toml")], 2) == (0, 1)  # 'old' left the files
        raw.commit()
    with engine.begin() as conn:
        schedules.put(conn, "xmas-aware", {**SPEC, "calendar": "holidays",
                                           "on_calendar": "next_day"}, schema=schema)
    (canonical,) = rows(engine, "SELECT canonical FROM runtime_schedules")[0]
    assert canonical["calendar"] == {"name": "holidays", "dates": ["2026-12-25", "2026-12-26"]}
    assert canonical["on_calendar"] == "next_day"
    with engine.connect() as conn:
        assert schedules.get(conn, "xmas-aware", schema=schema)["calendar"] == "holidays"
    for name, message in (("holidayz", "unknown calendar 'holidayz'; did you mean 'holidays'?"),
                          ("old", "unknown calendar 'old'; define it as [calendars.old] in a "
                                  "schedule file")):
        with engine.begin() as conn, pytest.raises(ScheduleError) as err:
            schedules.put(conn, "x", {**SPEC, "calendar": name}, schema=schema)
        assert err.value.problems == [{"schedule": "x", "message": message}]


def test_tombstones_are_pruned_once_a_leader_recorded_the_removal(engine, schema):
    from cronkeeper.db.engine import driver
    from cronkeeper.db.runtime_schedules import runtime_prune

    with engine.begin() as conn:
        ids = schedules.put_many(conn, {"adopted": SPEC, "unadopted": SPEC, "recent": SPEC,
                                        "live": SPEC}, schema=schema)
        for name in ("adopted", "unadopted", "recent"):
            schedules.delete(conn, name, schema=schema)
    with engine.connect() as conn:
        raw = driver(conn)
        raw.execute(f'SET search_path = "{schema}"')
        long_ago = datetime.now(UTC) - timedelta(days=40)
        for name in ("adopted", "recent"):  # as a leader: the version, then its removal
            versions_insert(raw, [(name, "d", {"task": "t"})], long_ago, 1,
                            origins=["runtime"], ids=[ids[name]])
            versions_insert(raw, [(name, "removed", None)], long_ago + timedelta(days=1), 1,
                            origins=["runtime"])
        raw.execute("UPDATE runtime_schedules SET deleted_at = now() - interval '30 days'"
                    " WHERE name IN ('adopted', 'unadopted')")
        assert runtime_prune(raw, days=14, batch=100) == 1
        raw.commit()
    assert [r[0] for r in rows(engine)] == ["live", "recent", "unadopted"]
