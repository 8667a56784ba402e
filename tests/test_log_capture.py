"""A handler's log records kept with its attempt (cronkeeper.worker.logcapture), in one process:
each record goes to the job that emitted it (runtime.Running) and to no other, in its order, as
one line with its instant; the cap keeps the exact first and last halves of those lines; an
output taken when its job is abandoned keeps what came before and nothing after. The same with
real workers: tests/test_job_output.py."""

from __future__ import annotations

import asyncio
import calendar
import logging
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_output_capture import reference

from cronkeeper.output import left_out_line
from cronkeeper.worker import logcapture
from cronkeeper.worker.logcapture import JobLogCapture, capturing, line
from cronkeeper.worker.runtime import Running


@pytest.fixture
def log():
    """A logger of its own with the capture's handler (the root logger is left alone)."""
    logger = logging.getLogger("tests.logcapture")
    handler = JobLogCapture()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger
    logger.removeHandler(handler)


def record(created: float, msg: str = "m %s", args: tuple = ("x",)) -> logging.LogRecord:
    rec = logging.LogRecord("tests.logcapture", logging.INFO, __file__, 1, msg, args, None)
    rec.created = created
    return rec


def stamp_ms(text: str) -> int:
    """The instant a line's stamp says, in milliseconds since the epoch."""
    stamp = text.split(" ", 1)[0]
    assert len(stamp) == 24 and stamp[19] == "." and stamp.endswith("Z"), stamp
    return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) * 1000 + int(stamp[20:23])


def held(limit: int) -> Running:
    job = Running(job=None)  # type: ignore[arg-type] - no job is read
    if limit > 0:
        job.keep_records(limit)  # as run_task does for a handler in this process
    return job


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 4e9, allow_nan=False) | st.sampled_from(
    [1772953201.0, 1772953201.0009999, 1772953201.001, 1772953201.9999999, 1772953202.0]),
    min_size=1, max_size=30))
def test_each_line_carries_the_millisecond_of_its_record_whatever_came_before(instants):
    # The stamp is kept for records of the same millisecond: records of other milliseconds,
    # seconds and years in any order must each get their own.
    for created in instants + instants[::-1]:
        text = line(record(created))
        assert text.endswith(" INFO tests.logcapture: m x\n")
        ms = stamp_ms(text)
        assert ms - 1e-3 <= created * 1000 < ms + 1 + 1e-3, (created, text)


def test_the_handler_writes_the_line_that_line_writes(log):
    # handle() writes line() out for speed: both must make the same text of the same records,
    # tracebacks and stacks included.
    records: list[logging.LogRecord] = []
    keeper = logging.Handler()
    keeper.emit = records.append  # type: ignore[method-assign]
    log.addHandler(keeper)
    job = held(1 << 16)
    try:
        with capturing(job):
            log.info("plain %d and %s", 1, "two")
            log.warning("no args, a literal %s")
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("failed")
            log.info("with its stack", stack_info=True)
    finally:
        log.removeHandler(keeper)
    kept = job.output().decode()
    assert len(records) == 4 and kept == "".join(line(r) for r in records)
    assert "ValueError: boom" in kept and 'raise ValueError("boom")' in kept
    assert "Stack (most recent call last):" in kept and "literal %s\n" in kept


def test_records_outside_any_job_and_of_other_jobs_are_not_kept(log):
    mine, other = held(1 << 16), held(1 << 16)
    log.info("before any job")
    with capturing(mine):
        log.info("mine 1")
        with capturing(other):
            log.info("other 1")
        log.info("mine 2")
    log.info("after the job")
    assert [x.split(": ", 1)[1] for x in mine.output().decode().splitlines()] == ["mine 1", "mine 2"]
    assert [x.split(": ", 1)[1] for x in other.output().decode().splitlines()] == ["other 1"]


def test_two_jobs_on_two_threads_logging_in_strict_alternation_keep_only_their_own(log):
    turns = [threading.Event(), threading.Event()]
    jobs = [held(1 << 20), held(1 << 20)]
    stray: list[BaseException] = []

    def job(me: int) -> None:
        try:
            with capturing(jobs[me]):
                for i in range(300):
                    assert turns[me].wait(10)
                    turns[me].clear()
                    log.info("job %d line %d", me, i)
                    turns[1 - me].set()
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            stray.append(exc)
            turns[1 - me].set()

    threads = [threading.Thread(target=job, args=(me,)) for me in (0, 1)]
    for t in threads:
        t.start()
    turns[0].set()
    for t in threads:
        t.join(30)
    assert not stray
    for me in (0, 1):
        lines = jobs[me].output().decode().splitlines()
        assert [x.split(": ", 1)[1] for x in lines] == [f"job {me} line {i}" for i in range(300)]


def test_an_async_job_keeps_its_tasks_and_to_thread_records_and_not_its_neighbours(log):
    jobs = {"a": held(1 << 20), "b": held(1 << 20)}

    async def handler(key: str) -> None:
        async def task(i: int) -> None:
            log.info("%s task %d", key, i)
            await asyncio.sleep(0)

        for i in range(50):
            log.info("%s main %d", key, i)
            await asyncio.gather(task(i), asyncio.to_thread(log.info, "%s thread %d", key, i))

    def job(key: str) -> None:
        with capturing(jobs[key]):
            asyncio.run(handler(key))

    threads = [threading.Thread(target=job, args=(key,)) for key in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for key, other in (("a", "b"), ("b", "a")):
        messages = [x.split(": ", 1)[1] for x in jobs[key].output().decode().splitlines()]
        assert not [m for m in messages if m.startswith(other)]
        for kind in ("main", "task", "thread"):
            assert [m for m in messages if f" {kind} " in m] == [f"{key} {kind} {i}" for i in range(50)]


@settings(max_examples=200, deadline=None)
@given(messages=st.lists(st.text(max_size=120), max_size=60), limit=st.integers(1, 900))
def test_lines_past_the_cap_keep_exactly_the_first_and_last_halves(messages, limit):
    # A handler's records, ASCII or not, through the root handler into its job: spilled into
    # its capture as they pass the limit, the rest taken at the end, the output is what the cap
    # keeps of their lines' concatenation in order, however they were folded.
    handler = JobLogCapture()
    job = held(limit)
    fed = b""
    with capturing(job):
        for message in messages:
            rec = record(1772953201.25, message, ())
            handler.handle(rec)
            fed += line(rec).encode("utf-8", "replace")
    assert job.output() == reference(fed, limit)
    # A capture is made only past the limit, and then every byte reached it, kept or not.
    assert (job.capture is not None) == (len(fed) > limit)
    assert job.capture is None or job.capture.total == len(fed)


def test_a_handler_logging_megabytes_is_held_within_the_cap(log):
    job = held(4096)
    with capturing(job):
        for i in range(20000):
            log.info("line %06d %s", i, "x" * 80)
        # Spilled as it goes: never much more than the limit pending as lines.
        assert job.pending <= 4096 + 200 and sum(map(len, job.lines)) <= 4096 + 200
    kept = job.output().decode()
    lines = kept.splitlines()
    assert lines[0].endswith(": line 000000 " + "x" * 80)
    assert lines[-1].endswith(": line 019999 " + "x" * 80)
    assert "[cronkeeper: " in kept and len(kept.encode()) <= 4096 + 64


def test_the_output_taken_when_a_job_is_abandoned_keeps_what_came_before_only(log):
    # The worker takes the output of a thread it abandons at the timeout; the thread logs on.
    job = held(1 << 16)
    closed, logged_on = threading.Event(), threading.Event()

    def handler() -> None:
        with capturing(job):
            log.info("before the timeout")
            closed.wait(10)
            log.info("after the timeout")
            logged_on.set()

    thread = threading.Thread(target=handler)
    thread.start()
    while not any("before" in text for text in job.lines):
        time.sleep(0.001)
    kept = job.output()
    closed.set()
    assert logged_on.wait(10)
    thread.join(10)
    assert kept.decode().endswith("INFO tests.logcapture: before the timeout\n")
    assert job.output() == kept and b"after" not in kept and job.lines == []


def test_a_record_that_cannot_be_formatted_is_reported_and_not_kept():
    handler = JobLogCapture()
    reported: list[logging.LogRecord] = []
    handler.handleError = reported.append  # type: ignore[method-assign]
    job = held(1 << 16)
    bad, fine = record(1772953201.25, "two %s %s", ("only one",)), record(1772953201.5, "fine", ())
    with capturing(job):
        handler.handle(bad)
        handler.handle(fine)
    assert reported == [bad]
    assert job.output() == b"2026-03-08T07:00:01.500Z INFO tests.logcapture: fine\n"


def test_a_process_handler_writes_its_records_to_stderr(monkeypatch):
    # Process isolation: the child's records go to its stderr, the attempt's pipe.
    written: list[str] = []

    class Stream:
        def write(self, text: str) -> None:
            written.append(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())
    handler = logcapture._StderrRecords()
    handler.handle(record(1772953201.25, "child %s", ("line",)))
    assert written == ["2026-03-08T07:00:01.250Z INFO tests.logcapture: child line\n"]


# -- a job's records kept as lines on it (runtime.Running): a capture only past its limit -------

def test_a_job_that_logs_nothing_makes_no_capture_and_keeps_empty_output(log):
    job = held(1 << 16)
    with capturing(job):
        pass
    assert job.capture is None  # nothing made on the silent path
    assert job.output() == b""  # kept: it printed nothing (None would say "not kept")
    with capturing(job):  # abandoned at its timeout, it logs on: its output is final already
        log.info("too late")
    assert job.output() == b"" and job.capture is None and job.lines == []
    assert held(0).output() is None  # output_limit 0: nothing kept, as before


def test_a_job_keeps_its_records_as_lines_and_makes_a_capture_only_past_its_limit(log):
    job = held(1 << 16)
    with capturing(job):
        log.info("first %d", 1)
        log.info("second")
    assert job.capture is None  # within the limit: lines only, one join at the end
    assert [x.split(": ", 1)[1] for x in job.output().decode().splitlines()] == ["first 1", "second"]
    assert job.output() == job.output()  # final from the first call
    small = held(64)
    with capturing(small):
        for i in range(20):
            log.info("line %d", i)
        assert small.capture is not None and small.pending <= 64 + 80  # spilled as it went
    kept = small.output()
    assert b" bytes left out]\n" in kept and kept.endswith(b"line 19\n")
    # Every byte fed reached the capture, kept or not (a stamp is 24 characters).
    assert small.capture.total == sum(len(f"{'x' * 24} INFO tests.logcapture: line {i}\n")
                                      for i in range(20))


def test_an_abandoned_job_logging_on_past_its_limit_is_dropped_and_held_within_it(log):
    job = held(256)
    with capturing(job):
        log.info("before")
    kept = job.output()
    with capturing(job):  # its thread abandoned at the timeout logs on, a lot
        for i in range(5000):
            log.info("after %d %s", i, "x" * 100)
        assert job.pending <= 256 + 200 and len(job.lines) <= 3  # dropped as it goes
    assert job.output() == kept and kept.endswith(b"before\n")
    assert job.capture is None  # nothing made for what came after the end


def test_a_record_of_another_class_is_formatted_by_its_own_get_message(log):
    class Upper(logging.LogRecord):
        def getMessage(self) -> str:  # noqa: N802 - logging's name
            return super().getMessage().upper()

    job = held(1 << 16)
    with capturing(job):
        logcapture.install().handle(Upper("x", logging.INFO, __file__, 1, "shout %s",
                                          ("this",), None))
    assert job.output().endswith(b" INFO x: SHOUT THIS\n")


def test_threads_of_one_job_logging_past_its_limit_lose_no_byte_from_the_count(log):
    # A handler's own threads (to_thread, its tasks) log into its job while it spills them.
    job = held(1000)

    def write(tag: str) -> None:
        with capturing(job):
            for i in range(3000):
                log.info("%s%d", tag, i)

    threads = [threading.Thread(target=write, args=(t,)) for t in "abcd"]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch inside a spill, not only between records
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    kept = job.output()
    stamp_and_name = len("2026-03-08T07:00:01.250Z INFO tests.logcapture: \n")
    fed = sum(stamp_and_name + len(f"{t}{i}") for t in "abcd" for i in range(3000))
    assert job.capture is not None and job.capture.total == fed
    # The first and last 500 bytes, the line between (after a newline if the first half
    # does not end with one), nothing more.
    assert left_out_line(fed - 1000) in kept
    assert len(kept) == 1000 + len(left_out_line(fed - 1000)) + (0 if kept[499:500] == b"\n" else 1)


def test_a_record_emitted_while_its_job_holds_its_lock_does_not_wait_for_itself(log):
    # A finalizer that logs, run by a garbage collection while the job's lock is held (by a
    # spill or the end in this same thread), must not block on that lock.
    job = held(64)
    done = threading.Event()

    def under_the_lock() -> None:
        with capturing(job), job.lock:
            for i in range(5):
                log.info("line %d past the limit of 64 bytes, each of them", i)
        done.set()

    thread = threading.Thread(target=under_the_lock, daemon=True)
    thread.start()
    assert done.wait(10), "a record under its job's own lock waited for it"
    kept = job.output()  # the lines left for the end all reach the capture, within the limit
    each = len(f"{'x' * 24} INFO tests.logcapture: line 0 past the limit of 64 bytes, each of them\n")
    assert job.capture is not None and job.capture.total == 5 * each
    assert b"[cronkeeper: %d bytes left out]\n" % (5 * each - 64) in kept
    assert kept.endswith(b"each of them\n")


@pytest.mark.parametrize(("msg", "args", "shown"), [
    (b"bytes %s", (1,), "b'bytes 1'"),
    ({"a": 1}, (), "{'a': 1}"),
    ("%(who)s came", ({"who": "she"},), "she came"),
    (ValueError("an error as the message"), (), "an error as the message"),
])
def test_a_message_that_is_not_a_plain_string_is_kept_as_get_message_makes_it(msg, args, shown):
    job = held(1 << 16)
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, msg, args, None)
    with capturing(job):
        logcapture.install().handle(rec)
    assert rec.getMessage() == shown
    assert job.output().decode().endswith(f" INFO x: {shown}\n")
