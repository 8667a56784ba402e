"""What a job printed (docs/worker.md, "What a job printed"): real workers on a real PostgreSQL
run commands and handlers; each attempt's output is read back from ``attempts.output`` and
through ``cronkeeper output``, ``explain``, ``dlq show`` and the web."""

from __future__ import annotations

import http.client
import json
import os
import pty
import select
import subprocess
import sys
from urllib.parse import quote

import pytest
from daemon_harness import wait_for
from handlers_for_tests import cronkeeper_exe, q
from web_seed import WebServer

import cronkeeper
from cronkeeper.db.prune import prune
from cronkeeper.operations.output import last_output_tail

PY = sys.executable


def output_of(engine, job: int, attempt: int | None = None) -> bytes | None:
    """The stored output of one attempt (the newest without ``attempt``)."""
    rows = q(engine, "SELECT output FROM attempts WHERE job_id = %(j)s AND (%(a)s::int IS NULL "
             "OR attempt = %(a)s) ORDER BY started_at DESC, id DESC LIMIT 1", j=job, a=attempt)
    assert rows, f"job {job} has no attempt {attempt}"
    return None if rows[0][0] is None else bytes(rows[0][0])


def job_state(engine, job: int) -> tuple:
    return q(engine, "SELECT state, attempts, last_error FROM outbox WHERE id = %(i)s", i=job)[0]


def ended(engine, job: int, state: str, proc) -> None:
    """Wait until the job is ``state`` with every attempt ended (the worker alive meanwhile)."""
    wait_for(lambda: job_state(engine, job)[0] == state and not q(
        engine, "SELECT 1 FROM attempts WHERE job_id = %(j)s AND finished_at IS NULL", j=job),
        60, f"job {job} {state}", alive=proc)


def cli(database_url: str, schema: str, *args: str, tty: bool = False) -> tuple[int, bytes, str]:
    """``cronkeeper ARGS`` with stdout a pipe, or a terminal (a pty) when ``tty``."""
    argv = [cronkeeper_exe(), *args, "--database-url", database_url, "--schema", schema]
    if not tty:
        done = subprocess.run(argv, capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
        return done.returncode, done.stdout, done.stderr.decode()
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(slave)
    seen = bytearray()
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        assert ready, "no output from the command on its terminal"
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    err = proc.stderr.read().decode()
    return proc.wait(30), bytes(seen), err


def enqueue(engine, task: str, payload: dict, key: str, **options) -> int:
    with engine.begin() as conn:
        schema = conn.exec_driver_sql("SELECT current_schema()").scalar()
        job = cronkeeper.enqueue(conn, task, payload, key=key, schema=schema, **options)
    assert job is not None
    return job


# -- commands ------------------------------------------------------------------------------------

INTERLEAVE = (
    "import sys\n"
    "for i in range(200):\n"
    "    (sys.stdout if i % 2 == 0 else sys.stderr).write(f'{i} {\"out\" if i % 2 == 0 else \"err\"}\\n')\n"
)


def test_stdout_and_stderr_interleaved_in_arrival_order(engine, schema, database_url, spawned_workers,
                                                         command_schedule):
    schedules, job = command_schedule([PY, "-u", "-c", INTERLEAVE])
    proc = spawned_workers("--schedules", schedules)
    ended(engine, job, "succeeded", proc)
    expected = "".join(f"{i} {'out' if i % 2 == 0 else 'err'}\n" for i in range(200)).encode()
    assert output_of(engine, job) == expected
    code, out, _ = cli(database_url, schema, "output", "backup@2026-03-08T07:00:00Z")
    assert (code, out) == (0, expected)


PATTERN = "import sys; sys.stdout.buffer.write(bytes((i * 7) % 251 for i in range(10000)))"


def test_past_the_limit_the_first_and_last_halves_are_kept_exactly(engine, schema, database_url, spawned_workers,
                                                                     command_schedule):
    schedules, job = command_schedule([PY, "-c", PATTERN], extra='output_limit = "1000B"\n')
    proc = spawned_workers("--schedules", schedules)
    ended(engine, job, "succeeded", proc)
    data = bytes((i * 7) % 251 for i in range(10000))
    head, tail = data[:500], data[-500:]
    assert not head.endswith(b"\n")
    expected = head + b"\n[cronkeeper: 9000 bytes left out]\n" + tail
    assert output_of(engine, job) == expected
    code, out, _ = cli(database_url, schema, "output", "backup@2026-03-08T07:00:00Z")
    assert (code, out) == (0, expected)  # bytes as captured, invalid UTF-8 and all


ATTEMPTS = ('echo "attempt $CRONKEEPER_ATTEMPT"; echo "stderr $CRONKEEPER_ATTEMPT" >&2; '
            'test "$CRONKEEPER_ATTEMPT" -ge 3')


def test_each_attempt_keeps_its_own_output_and_output_exit_codes(engine, schema, database_url, spawned_workers,
                                                                 command_schedule):
    schedules, job = command_schedule(["/bin/sh", "-c", ATTEMPTS], max_attempts=3)
    proc = spawned_workers("--schedules", schedules)
    ended(engine, job, "succeeded", proc)
    key = "backup@2026-03-08T07:00:00Z"
    for n in (1, 2, 3):
        assert output_of(engine, job, n) == f"attempt {n}\nstderr {n}\n".encode()
        assert cli(database_url, schema, "output", key, "--attempt", str(n))[:2] == (
            0, f"attempt {n}\nstderr {n}\n".encode())
    assert cli(database_url, schema, "output", key)[:2] == (0, b"attempt 3\nstderr 3\n")
    # The failed attempts' errors are the exit status alone: their output is beside them.
    assert q(engine, "SELECT attempt, error FROM attempts WHERE job_id = %(j)s ORDER BY attempt",
             j=job) == [(1, "exit status 1"), (2, "exit status 1"), (3, None)]
    code, out, err = cli(database_url, schema, "output", key, "--attempt", "4")
    assert (code, out) == (1, b"") and "no attempt 4" in err and "Traceback" not in err
    code, out, err = cli(database_url, schema, "output", "backup@1999-01-01T00:00:00Z")
    assert (code, out) == (1, b"") and "no job with key" in err and "Traceback" not in err
    code, out, _ = cli(database_url, schema, "explain", key)
    text = out.decode()
    assert code == 0 and "output: 19 bytes" in text and "  | attempt 2\n  | stderr 2\n" in text


def test_a_dead_letter_keeps_the_tail_of_its_last_output(engine, schema, database_url, spawned_workers,
                                                         command_schedule):
    script = 'for i in $(seq 1 30); do echo "line $i"; done; exit 65'
    schedules, job = command_schedule(["/bin/sh", "-c", script])
    proc = spawned_workers("--schedules", schedules)
    ended(engine, job, "dead", proc)
    tail = "\n".join(f"line {i}" for i in range(21, 31))
    state, attempts, last_error = job_state(engine, job)
    assert (state, attempts) == ("dead", 1)
    assert last_error == f"exit status 65 (permanent)\noutput (last lines):\n{tail}"
    assert q(engine, "SELECT error FROM attempts WHERE job_id = %(j)s", j=job) == [
        ("exit status 65 (permanent)",)]
    with engine.connect() as conn:
        assert last_output_tail(conn, job) == tail  # what notifications will quote
    code, out, _ = cli(database_url, schema, "dlq", "show", str(job))
    shown = out.decode()
    assert code == 0 and "last_error       exit status 65 (permanent)" in shown
    assert all(f"line {i}" in shown for i in range(21, 31)) and "line 20\n" not in shown
    code, out, _ = cli(database_url, schema, "dlq", "show", str(job), "--format", "json")
    doc = json.loads(out)
    assert doc["last_error"] == last_error
    assert doc["attempt_log"][0]["output_bytes"] == sum(len(f"line {i}\n") for i in range(1, 31))
    assert doc["attempt_log"][0]["output_last_lines"] == tail.split("\n")


HOSTILE = ("printf '\\033[31mred\\033[0m\\tok\\r\\n'; printf '\\377\\376 not utf-8\\n'; "
           "printf '\\033]0;owned\\007title\\n'; printf 'caf\\303\\251\\n'")
HOSTILE_BYTES = (b"\x1b[31mred\x1b[0m\tok\r\n\xff\xfe not utf-8\n\x1b]0;owned\x07title\n"
                 b"caf\xc3\xa9\n")


def test_escape_sequences_never_reach_a_terminal_or_a_page_raw(engine, schema, database_url, spawned_workers,
                                                               command_schedule, cluster,
                                                               tmp_path):
    schedules, job = command_schedule(["/bin/sh", "-c", HOSTILE])
    proc = spawned_workers("--schedules", schedules)
    ended(engine, job, "succeeded", proc)
    key = "backup@2026-03-08T07:00:00Z"
    assert output_of(engine, job) == HOSTILE_BYTES
    # A pipe gets the bytes as captured.
    assert cli(database_url, schema, "output", key)[:2] == (0, HOSTILE_BYTES)
    # A terminal gets them escaped (the pty turns "\n" into "\r\n" on its way out).
    code, seen, _ = cli(database_url, schema, "output", key, tty=True)
    assert code == 0
    assert b"\x1b" not in seen and b"\x07" not in seen and b"\xff" not in seen
    assert seen.replace(b"\r\n", b"\n") == (
        b"\\x1b[31mred\\x1b[0m\tok\\x0d\n\\xff\\xfe not utf-8\n\\x1b]0;owned\\x07title\n"
        b"caf\xc3\xa9\n")
    code, seen, _ = cli(database_url, schema, "explain", key, tty=True)
    assert code == 0 and b"\x1b" not in seen and b"\\x1b[31mred" in seen and b"\x07" not in seen
    server = WebServer(database_url, schema, cluster, log=tmp_path / "web.log")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", f"/explain/{quote(key)}")
        page = conn.getresponse().read().decode()
        conn.request("GET", f"/api/output/{quote(key)}?attempt=1")
        reply = conn.getresponse()
        body = reply.read()
        conn.request("GET", f"/api/output/{quote(key)}?attempt=9")
        missing = conn.getresponse()
        missing.read()
        conn.request("GET", f"/api/output/{quote('nope@2026-03-08T07:00:00Z')}")
        unknown = conn.getresponse()
        unknown.read()
        conn.close()
    finally:
        server.stop()
    assert "\x1b" not in page and "\x07" not in page and "\\x1b[31mred" in page
    assert "caf\u00e9" in page
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert body.decode("utf-8") == HOSTILE_BYTES.decode("utf-8", "replace")
    assert "\ufffd\ufffd not utf-8" in body.decode("utf-8")
    assert (missing.status, unknown.status) == (404, 404)


def test_a_command_killed_at_its_timeout_keeps_what_it_printed(engine, schema, database_url, spawned_workers,
                                                               command_schedule):
    script = 'echo "before the kill"; echo "to stderr" >&2; sleep 30; echo after'
    schedules, job = command_schedule(["/bin/sh", "-c", script], timeout="1s", max_attempts=1)
    proc = spawned_workers("--schedules", schedules, "--kill-grace", "0.2")
    ended(engine, job, "dead", proc)
    assert q(engine, "SELECT outcome FROM attempts WHERE job_id = %(j)s", j=job) == [("timeout",)]
    assert output_of(engine, job) == b"before the kill\nto stderr\n"
    assert job_state(engine, job)[2].endswith("output (last lines):\nbefore the kill\nto stderr")


def test_output_limit_zero_keeps_nothing(engine, schema, database_url, spawned_workers, command_schedule):
    schedules, job = command_schedule(["/bin/sh", "-c", "echo secret; exit 1"], max_attempts=1,
                                      extra='output_limit = "0B"\n')
    proc = spawned_workers("--schedules", schedules)
    ended(engine, job, "dead", proc)
    assert output_of(engine, job) is None
    assert "secret" not in job_state(engine, job)[2]
    code, out, err = cli(database_url, schema, "output", "backup@2026-03-08T07:00:00Z")
    assert (code, out) == (0, b"") and "kept no output" in err


# -- handlers --------------------------------------------------------------------------------------

def test_two_concurrent_handlers_never_get_each_others_records(engine, schema, database_url, spawned_workers):
    a = enqueue(engine, "output.alternate", {"me": 0, "lines": 200}, "alt-a")
    b = enqueue(engine, "output.alternate", {"me": 1, "lines": 200}, "alt-b")
    c = enqueue(engine, "output.alternate_async", {"lines": 50}, "async-c")
    d = enqueue(engine, "output.alternate_async", {"lines": 50}, "async-d")
    proc = spawned_workers("--import", "handlers_output", "--concurrency", "4")
    for job in (a, b, c, d):
        ended(engine, job, "succeeded", proc)
    for job, key in ((a, "alt-a"), (b, "alt-b")):
        lines = output_of(engine, job).decode().splitlines()
        assert [line.split(" INFO tests.output: ")[1] for line in lines] == [
            f"{key} line {i}" for i in range(200)]
    for job, key, other in ((c, "async-c", "async-d"), (d, "async-d", "async-c")):
        text = output_of(engine, job).decode()
        assert other not in text
        messages = [line.split(" INFO tests.output: ")[1] for line in text.splitlines()]
        for kind in ("main", "task", "thread"):  # its coroutine, a task it spawned, to_thread
            assert [m for m in messages if f" {kind} " in m] == [
                f"{key} {kind} {i}" for i in range(50)]


def test_process_isolation_keeps_prints_and_records_in_order(engine, schema, database_url, spawned_workers):
    ok = enqueue(engine, "output.everything", {}, "everything-ok")
    bad = enqueue(engine, "output.everything", {"fail": True}, "everything-bad", max_attempts=1)
    own = enqueue(engine, "output.log_in_transaction", {}, "own-commit")
    proc = spawned_workers("--import", "handlers_output", "--isolation", "process",
                           "--concurrency", "2")
    ended(engine, ok, "succeeded", proc)
    ended(engine, bad, "dead", proc)
    ended(engine, own, "succeeded", proc)
    for job in (ok, bad):
        lines = output_of(engine, job).decode().splitlines()
        assert lines[:3] == ["1 print to stdout", "2 write to stderr", "3 raw write to fd 1"]
        assert lines[3].endswith(" WARNING tests.output: 4 a log record")
        assert lines[4:] == ["5 from a subprocess", "6 its stderr", "7 print without newline"]
    last_error = job_state(engine, bad)[2]
    assert last_error.startswith("RuntimeError: failing after printing")
    assert last_error.endswith("6 its stderr\n7 print without newline")
    # Committed by the handler process itself, its output written by the worker beside it:
    # just after that commit, so it may not be there yet when the job reads as ended.
    wait_for(lambda: output_of(engine, own) is not None, 60, "own-commit's output", alive=proc)
    text = output_of(engine, own).decode()
    assert "INFO tests.output: own-commit in its transaction\n" in text
    assert text.endswith("own-commit printed\n")


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_handlers_killed_at_their_timeout_keep_what_they_logged(engine, schema, database_url, spawned_workers,
                                                               isolation):
    sync = enqueue(engine, "output.log_then_hang", {"sleep": 30}, f"hang-{isolation}",
                   timeout=1, max_attempts=1)
    coro = enqueue(engine, "output.log_then_hang_async", {"sleep": 30},
                   f"hang-async-{isolation}", timeout=1, max_attempts=1)
    proc = spawned_workers("--import", "handlers_output", "--isolation", isolation,
                           "--kill-grace", "0.2", "--concurrency", "2")
    ended(engine, sync, "dead", proc)
    ended(engine, coro, "dead", proc)
    for job, key in ((sync, f"hang-{isolation}"), (coro, f"hang-async-{isolation}")):
        assert q(engine, "SELECT outcome FROM attempts WHERE job_id = %(j)s", j=job) == [
            ("timeout",)]
        text = output_of(engine, job).decode()
        assert f"INFO tests.output: {key} before the hang\n" in text
        assert "after the hang" not in text
    if isolation == "process":  # its print, too (a thread's goes to the worker's stdout)
        assert output_of(engine, sync).decode().endswith(f"hang-{isolation} printed before the hang\n")


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_silent_handlers_keep_empty_output_and_late_records_are_kept(engine, schema, database_url,
                                                                     spawned_workers, isolation):
    """A handler that logs nothing stores an empty output (kept, and nothing in it: not NULL),
    failing or killed at its timeout too; one that logs after a silent start keeps its line."""
    def job(task: str, payload: dict, key: str, **options) -> int:
        return enqueue(engine, task, payload, f"{key}-{isolation}", max_attempts=1, **options)

    silent = job("output.silent_then_log", {}, "silent")
    failed = job("output.silent_then_log", {"fail": "quietly"}, "silent-failed")
    hung = job("output.silent_then_log", {"sleep": 30}, "silent-hung", timeout=1)
    late = job("output.silent_then_log", {"sleep": 0.3, "log": True}, "late")
    late_async = job("output.silent_then_log_async", {"sleep": 0.3, "log": True}, "late-async")
    proc = spawned_workers("--import", "handlers_output", "--isolation", isolation,
                           "--kill-grace", "0.2", "--concurrency", "3")
    for one, state in ((silent, "succeeded"), (failed, "dead"), (hung, "dead"),
                       (late, "succeeded"), (late_async, "succeeded")):
        ended(engine, one, state, proc)
    for one in (silent, failed, hung):
        assert output_of(engine, one) == b""
    assert job_state(engine, failed)[2] == "RuntimeError: quietly (attempt 1 of 1: giving up)"
    for one, key in ((late, "late"), (late_async, "late-async")):
        text = output_of(engine, one).decode()
        assert text.endswith(f" INFO tests.output: {key}-{isolation} after a silent start\n")
        assert text.count("\n") == 1


def test_enqueued_jobs_follow_the_workers_output_limit(engine, schema, database_url,
                                                       spawned_workers):
    job = enqueue(engine, "output.log_lines", {"lines": 100}, "limited")
    proc = spawned_workers("--import", "handlers_output", "--output-limit", "1KiB")
    ended(engine, job, "succeeded", proc)
    proc.kill()  # the next job is for the next worker
    proc.wait()
    text = output_of(engine, job)
    assert len(text) < 1100 and b" bytes left out]\n" in text
    assert text.endswith(b"limited line 99\n")
    none = enqueue(engine, "output.log_lines", {"lines": 3, "fail": "boom"}, "unkept",
                   max_attempts=1)
    proc = spawned_workers("--import", "handlers_output", "--output-limit", "0B")
    ended(engine, none, "dead", proc)
    assert output_of(engine, none) is None
    assert job_state(engine, none)[2] == "RuntimeError: boom (attempt 1 of 1: giving up)"
    bad = subprocess.run([cronkeeper_exe(), "worker", "--database-url", database_url, "--schema",
                          schema, "--output-limit", "2MiB"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "at most 1MiB" in bad.stderr and "Traceback" not in bad.stderr


# -- storage -------------------------------------------------------------------------------------

def test_pruning_removes_output_with_its_attempt(engine, schema, database_url, spawned_workers, command_schedule):
    schedules, job = command_schedule(["/bin/sh", "-c", "echo kept until pruned; exit 65"])
    other = enqueue(engine, "output.log_lines", {"lines": 2}, "recent")
    proc = spawned_workers("--schedules", schedules, "--import", "handlers_output")
    ended(engine, job, "dead", proc)
    ended(engine, other, "succeeded", proc)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE attempts SET finished_at = now() - interval '15 days' "
                             "WHERE job_id = %(j)s", {"j": job})
    assert q(engine, "SELECT count(*) FROM attempts WHERE output IS NOT NULL") == [(2,)]
    with engine.begin() as conn:
        pruned = prune(conn.connection.driver_connection, jobs_days=14, periods_days=400,
                       batch=1000)
    assert pruned[1] == 1  # one attempt
    assert q(engine, "SELECT job_id FROM attempts WHERE output IS NOT NULL") == [(other,)]
    # The dead letter stays (operators replay or discard it), its last_error with the tail.
    assert job_state(engine, job)[2].endswith("output (last lines):\nkept until pruned")
    code, _, err = cli(database_url, schema, "output", "backup@2026-03-08T07:00:00Z")
    assert code == 1 and "has no attempt yet" in err


def test_a_worker_on_a_schema_without_the_column_keeps_the_tail_in_the_error(
        engine, schema, database_url, command_schedule, spawned_workers):
    with engine.begin() as conn:  # the previous release's attempts table
        conn.exec_driver_sql("ALTER TABLE attempts DROP COLUMN output")
    schedules, job = command_schedule(["/bin/sh", "-c", "echo why it failed; exit 1"],
                                      max_attempts=1)
    proc = spawned_workers("--schedules", schedules)
    ended(engine, job, "dead", proc)
    error = q(engine, "SELECT error FROM attempts WHERE job_id = %(j)s", j=job)[0][0]
    assert error.startswith("exit status 1") and error.endswith("output (last lines):\nwhy it failed")


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_worker_keeping_nothing_makes_no_record_until_a_job_keeps_them(engine, schema,
                                                                       spawned_workers, isolation):
    """``--output-limit 0B`` and no schedule that keeps output: the root logger is left at
    WARNING, so a discarded ``log.info`` record is never made (as before output was kept). The
    first job whose schedule keeps output lowers it, in the worker and in its handler
    processes (told with each job), and its lines are kept; the jobs after it make theirs."""
    first = enqueue(engine, "output.report_level", {}, f"first-{isolation}", max_attempts=1)
    proc = spawned_workers("--import", "handlers_output", "--output-limit", "0B",
                           "--isolation", isolation, "--concurrency", "1")
    ended(engine, first, "dead", proc)
    assert "info records made: False" in job_state(engine, first)[2]
    assert output_of(engine, first) is None
    with engine.begin() as conn:  # a schedule's version and its job, as a leader writes them
        version = conn.exec_driver_sql(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "('keeps', 'd', '{\"task\": \"output.report_level\"}', now(), 1) RETURNING id").scalar()
        kept = conn.exec_driver_sql(
            "INSERT INTO outbox (idempotency_key, schedule, scheduled_for, version_id, task, "
            "max_attempts) VALUES (%(k)s, 'keeps', now(), %(v)s, 'output.report_level', 1) "
            "RETURNING id", {"k": f"keeps-{isolation}", "v": version}).scalar()
    ended(engine, kept, "dead", proc)
    assert "info records made: True" in job_state(engine, kept)[2]
    assert output_of(engine, kept).decode().endswith(
        f" INFO tests.output: keeps-{isolation} info line\n")
    after = enqueue(engine, "output.report_level", {}, f"after-{isolation}", max_attempts=1)
    ended(engine, after, "dead", proc)
    assert "info records made: True" in job_state(engine, after)[2]
    assert output_of(engine, after) is None  # made, and dropped: its job keeps nothing
