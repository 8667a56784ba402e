"""Command jobs run only from the worker's own schedule files."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import psycopg
import pytest
from handlers_for_tests import q, spawn_worker, wait_until

from cronkeeper.output import Capture
from cronkeeper.worker import commands


def state_of(engine, job):
    return q(engine, "SELECT state, attempts, last_error FROM outbox WHERE id = %(i)s", i=job)[0]


def test_command_gets_its_environment_and_argv_from_the_schedule(engine, schema, database_url, tmp_path,
                                                                  command_schedule):
    out = tmp_path / "env.jsonl"
    schedules, job = command_schedule(["tests/bin/record_env", str(out), "0"], payload={"region": "us"})
    proc = spawn_worker(database_url, schema, "--schedules", schedules)
    try:
        wait_until(lambda: state_of(engine, job)[0] == "succeeded", 20)
    finally:
        proc.kill()
        proc.wait()
    env = json.loads(out.read_text().splitlines()[0])
    assert env["CRONKEEPER_SCHEDULE"] == "backup"
    assert env["CRONKEEPER_SCHEDULED_FOR"] == "2026-03-08T07:00:00Z"
    assert env["CRONKEEPER_IDEMPOTENCY_KEY"] == "backup@2026-03-08T07:00:00Z"
    assert env["CRONKEEPER_ATTEMPT"] == "1"
    assert json.loads(env["CRONKEEPER_PAYLOAD"]) == {"region": "us"}


def test_exit_codes_permanent_and_tempfail(engine, schema, database_url, tmp_path, command_schedule):
    out = tmp_path / "env.jsonl"
    schedules, job = command_schedule(["tests/bin/record_env", str(out), "65"])
    proc = spawn_worker(database_url, schema, "--schedules", schedules)
    try:
        wait_until(lambda: state_of(engine, job)[0] == "dead", 20)
        assert state_of(engine, job)[1] == 1
    finally:
        proc.kill()
        proc.wait()


def test_tempfail_retries(engine, schema, database_url, tmp_path, command_schedule):
    out = tmp_path / "env.jsonl"
    schedules, job = command_schedule(["tests/bin/record_env", str(out), "75"], max_attempts=3)
    proc = spawn_worker(database_url, schema, "--schedules", schedules)
    try:
        wait_until(lambda: state_of(engine, job)[0] == "dead", 30)
    finally:
        proc.kill()
        proc.wait()
    assert state_of(engine, job)[1] == 3
    assert [json.loads(line)["CRONKEEPER_ATTEMPT"] for line in out.read_text().splitlines()] == ["1", "2", "3"]


def test_hand_written_row_cannot_run_a_command(engine, schema, database_url, tmp_path, command_schedule):
    marker = tmp_path / "pwned"
    schedules, _ = command_schedule(["tests/bin/record_env", str(tmp_path / "ok"), "0"])
    with engine.begin() as conn:
        ids = [r[0] for r in conn.exec_driver_sql(
            "INSERT INTO outbox (idempotency_key, schedule, task, payload) VALUES "
            "('evil-1', 'backup', 'command', %(p)s), ('evil-2', 'nope', 'command', %(p)s), "
            "('evil-3', NULL, 'command', %(p)s) RETURNING id",
            {"p": json.dumps({"command": ["touch", str(marker)], "argv": ["touch", str(marker)]})})]
        forged = conn.exec_driver_sql(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('backup', 'forged', %(s)s, now() - interval '1 day', 1) RETURNING id",
            {"s": json.dumps({"command": ["touch", str(marker)]})}).scalar()
        ids.append(conn.exec_driver_sql(
            "INSERT INTO outbox (idempotency_key, schedule, version_id, task) VALUES "
            "('evil-4', 'backup', %(v)s, 'command') RETURNING id", {"v": forged}).scalar())
    proc = spawn_worker(database_url, schema, "--schedules", schedules)
    try:
        wait_until(lambda: all(state_of(engine, i)[0] == "dead" for i in ids), 20)
    finally:
        proc.kill()
        proc.wait()
    assert not marker.exists()
    errors = [state_of(engine, i)[2] for i in ids]
    assert all("schedule version" in e for e in errors[:3])
    assert "superseded" in errors[3]


def test_a_version_the_worker_ran_is_not_read_again(engine, schema, database_url, tmp_path,
                                                     command_schedule):
    """A command job of a version whose digest the worker already read (the one its file
    has) runs without reading ``schedule_versions`` again: a version never changes. Here the
    table is moved away after the first job, and the next job of that version still runs."""
    out = tmp_path / "env.jsonl"
    schedules, first = command_schedule(["tests/bin/record_env", str(out), "0"])
    proc = spawn_worker(database_url, schema, "--schedules", schedules)
    try:
        wait_until(lambda: state_of(engine, first)[0] == "succeeded", 20)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE schedule_versions RENAME TO schedule_versions_away")
            second = conn.exec_driver_sql(
                "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, "
                "payload) SELECT 'backup@2026-03-08T08:00:00Z', schedule, "
                "'2026-03-08T08:00:00Z', version_id, task, payload FROM outbox WHERE id = %(i)s "
                "RETURNING id", {"i": first}).scalar()
        wait_until(lambda: state_of(engine, second)[0] == "succeeded", 20,
                   message=f"the second job: {state_of(engine, second)}")
    finally:
        proc.kill()
        proc.wait()
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE IF EXISTS schedule_versions_away RENAME TO "
                                 "schedule_versions")
    keys = [json.loads(line)["CRONKEEPER_IDEMPOTENCY_KEY"] for line in out.read_text().splitlines()]
    assert keys == ["backup@2026-03-08T07:00:00Z", "backup@2026-03-08T08:00:00Z"]


def test_newer_version_waits_without_counting_an_attempt(engine, schema, database_url, tmp_path,
                                                          command_schedule):
    schedules, job = command_schedule(["tests/bin/record_env", str(tmp_path / "x"), "0"])
    with engine.begin() as conn:
        newer = conn.exec_driver_sql(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('backup', 'f00dfeedf00dfeed', '{}', now() + interval '1 second', 1) RETURNING id").scalar()
        conn.exec_driver_sql("UPDATE outbox SET version_id = %(v)s WHERE id = %(i)s", {"v": newer, "i": job})
    proc = spawn_worker(database_url, schema, "--schedules", schedules)
    try:
        wait_until(lambda: "waiting" in (state_of(engine, job)[2] or ""), 20)
    finally:
        proc.kill()
        proc.wait()
    state, attempts, error = state_of(engine, job)
    assert (state, attempts) == ("available", 0)
    assert "f00dfeedf00d" in error
    assert q(engine, "SELECT count(*) FROM attempts WHERE job_id = %(i)s", i=job) == [(0,)]


# -- commands.run itself: real processes, output kept or discarded, with and without a pidfd -------

def _gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaps counts: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_command_released_by_the_drain_before_it_started_never_starts(
        engine, schema, database_url, tmp_path, command_schedule):
    # Its thread is reading the job's schedule version (held up here by a lock on the table)
    # when SIGTERM's drain releases the job: the command must not start afterwards, left
    # running past the worker's exit while the job, available again, runs elsewhere.
    pid_file = tmp_path / "started.pid"
    schedules, job = command_schedule(["/bin/sh", "-c", f"echo $$ > {pid_file}; sleep 60"])
    locker = psycopg.connect(database_url)
    locker.execute(f'LOCK TABLE "{schema}".schedule_versions IN ACCESS EXCLUSIVE MODE')
    proc = spawn_worker(database_url, schema, "--schedules", schedules, "--drain-timeout", "0.5")
    try:
        wait_until(lambda: q(engine, "SELECT count(*) FROM pg_locks WHERE NOT granted AND "
                             "relation = to_regclass(%(t)s)", t=f'"{schema}".schedule_versions')
                   == [(1,)], 30, message="the job's thread waits for its schedule version")
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: q(engine, "SELECT outcome FROM attempts WHERE job_id = %(i)s",
                             i=job) == [("released",)], 30, message="the job released")
        locker.rollback()  # the thread reads the version and goes on
        assert proc.wait(30) == 0
    finally:
        locker.close()
        proc.kill()
        proc.wait()
        if pid_file.exists() and pid_file.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    assert not pid_file.exists(), "the command started after its job was released"
    assert state_of(engine, job)[0] == "available"


def test_a_command_whose_file_is_being_written_is_retried_not_dead_lettered(
        engine, schema, database_url, tmp_path, command_schedule):
    # exec fails with ETXTBSY while a deploy still has the program open for writing: a passing
    # reason, unlike a program that is missing or not executable (dead letter at once).
    program = tmp_path / "deployed"
    program.write_text("#!/bin/sh\necho ran\n")
    program.chmod(0o755)
    schedules, job = command_schedule([str(program)], max_attempts=5)
    writer = os.open(program, os.O_WRONLY)
    proc = spawn_worker(database_url, schema, "--schedules", schedules)
    try:
        wait_until(lambda: q(engine, "SELECT outcome FROM attempts WHERE job_id = %(i)s "
                             "AND outcome IS NOT NULL", i=job), 20, message="attempt 1 ended")
        os.close(writer)  # the deploy is done
        writer = -1
        wait_until(lambda: state_of(engine, job)[0] in ("succeeded", "dead"), 30)
    finally:
        if writer >= 0:
            os.close(writer)
        proc.kill()
        proc.wait()
    first = q(engine, "SELECT outcome, error FROM attempts WHERE job_id = %(i)s AND attempt = 1", i=job)
    assert first[0][0] == "retry" and "Text file busy" in first[0][1], first
    assert state_of(engine, job)[0] == "succeeded"


@pytest.fixture(params=["pidfd", "no pidfd"])
def kernel(request, monkeypatch):
    """Both ways of waiting for the child: its pidfd, and an old kernel's (``Popen.wait``)."""
    if request.param == "no pidfd":
        monkeypatch.setattr(commands, "_pidfd", lambda pid: None)
    else:  # the pidfd path must really run here, not fall back unseen
        fd = commands._pidfd(os.getpid())
        assert fd is not None, "os.pidfd_open fails on this kernel: the pidfd path is untested"
        os.close(fd)
    return request.param


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "discarded"])
def test_a_command_ends_with_its_exit_status_whether_its_output_is_kept_or_not(kernel, keep):
    capture = Capture(1024) if keep else None
    started = []
    done = commands.run(("/bin/sh", "-c", "echo out; echo err >&2; exit 3"), dict(os.environ), 30,
                        on_start=started.append, capture=capture)
    assert done == commands.Exit(3)
    assert started and started[0].returncode == 3  # reaped: no zombie left behind
    if capture is not None:
        assert capture.close() == b"out\nerr\n"


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "discarded"])
def test_a_command_past_its_timeout_is_killed_with_its_whole_group(kernel, keep, tmp_path):
    pidfile = tmp_path / "background.pid"
    script = f"sleep 60 & echo $! > {pidfile}; echo started; sleep 60; echo never"
    capture = Capture(1024) if keep else None
    started = []
    done = commands.run(("/bin/sh", "-c", script), dict(os.environ), 2.0, kill_grace=0.2,
                        on_start=started.append, capture=capture)
    assert done == commands.Exit(None)
    assert started[0].returncode in (-signal.SIGTERM, -signal.SIGKILL)  # killed, and reaped
    background = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while not _gone(background) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(background), "the command's background process outlived its group's kill"
    if capture is not None:
        assert capture.close() == b"started\n"


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "discarded"])
def test_a_timeout_longer_than_one_poll_can_wait_is_waited_for(kernel, keep):
    # poll() takes at most 2**31 - 1 ms (24.8 days); a schedule's timeout may be years.
    capture = Capture(1024) if keep else None
    done = commands.run(("/bin/sh", "-c", "echo done; exit 7"), dict(os.environ), 3000 * 86400.0,
                        capture=capture)
    assert done == commands.Exit(7)
    if capture is not None:
        assert capture.close() == b"done\n"


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "discarded"])
def test_a_failure_while_waiting_kills_the_command_rather_than_leave_it_running(kernel, keep):
    started = []

    def fails(proc) -> None:
        started.append(proc)
        raise RuntimeError("the worker could not note the child")

    with pytest.raises(RuntimeError, match="could not note"):
        commands.run(("/bin/sleep", "60"), dict(os.environ), 120, kill_grace=0.2, on_start=fails,
                     capture=Capture(1024) if keep else None)
    assert started[0].returncode in (-signal.SIGTERM, -signal.SIGKILL)  # killed, and reaped


@pytest.mark.parametrize("keep", [True, False], ids=["kept", "discarded"])
def test_a_command_killed_by_another_thread_ends_its_wait(kernel, keep):
    # A worker told to stop kills its commands' groups from its own thread (loop.py's drain).
    started: list = []

    def kill_once_waiting() -> None:
        deadline = time.monotonic() + 30
        while not started and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the job's thread is in its wait by now (if not, it finds it dead)
        commands.kill_group(started[0], 0.0)

    killer = threading.Thread(target=kill_once_waiting)
    killer.start()
    done = commands.run(("/bin/sleep", "60"), dict(os.environ), 120, on_start=started.append,
                        capture=Capture(1024) if keep else None)
    killer.join(30)
    assert done.code in (-signal.SIGTERM, -signal.SIGKILL)  # not None: it did not wait 120 s
