"""Failure classes, payload shapes and the command-version decision: pure tables."""

import errno
import os
from dataclasses import dataclass
from typing import NotRequired, TypedDict

import pytest

from cronkeeper import PermanentError
from cronkeeper.schedule.model import Misfire, ScheduleSpec
from cronkeeper.worker.classify import (
    Ending,
    Kind,
    exception_ending,
    exit_ending,
    next_state,
    start_ending,
)
from cronkeeper.worker.commands import Verdict, decide
from cronkeeper.worker.registry import PayloadError, UnknownTask, check_shape, resolve, task

BACKOFF = {"base": 30, "factor": 2, "max": 3600}


@pytest.mark.parametrize(
    ("code", "extra", "kind"),
    [(0, (), Kind.SUCCEEDED), (1, (), Kind.RETRYABLE), (75, (), Kind.RETRYABLE),
     (64, (), Kind.PERMANENT), (68, (), Kind.PERMANENT), (69, (), Kind.RETRYABLE),
     (76, (), Kind.PERMANENT), (78, (), Kind.PERMANENT), (79, (), Kind.RETRYABLE),
     (3, (3,), Kind.PERMANENT), (3, (4,), Kind.RETRYABLE), (75, (75,), Kind.RETRYABLE),
     (-9, (), Kind.RETRYABLE)],
)
def test_exit_codes(code, extra, kind):
    assert exit_ending(code, extra).kind is kind


@pytest.mark.parametrize(
    ("number", "kind"),
    [(errno.ENOENT, Kind.PERMANENT), (errno.EACCES, Kind.PERMANENT), (errno.ENOEXEC, Kind.PERMANENT),
     (errno.ENOTDIR, Kind.PERMANENT), (errno.ETXTBSY, Kind.RETRYABLE), (errno.EAGAIN, Kind.RETRYABLE),
     (errno.ENOMEM, Kind.RETRYABLE), (errno.EMFILE, Kind.RETRYABLE)],
)
def test_a_command_that_cannot_start_is_permanent_only_while_its_program_cannot_run(number, kind):
    ending = start_ending("/opt/backup", OSError(number, os.strerror(number)))
    assert ending.kind is kind
    assert ending.error.startswith("cannot start '/opt/backup': ")


class Custom(Exception):
    cronkeeper_permanent = True


@pytest.mark.parametrize(
    ("exc", "kind"),
    [(PermanentError("no such invoice"), Kind.PERMANENT), (UnknownTask("x"), Kind.PERMANENT),
     (PayloadError("bad"), Kind.PERMANENT), (Custom("marked"), Kind.PERMANENT),
     (TimeoutError("503"), Kind.RETRYABLE), (ConnectionError(), Kind.RETRYABLE),
     (KeyError("k"), Kind.RETRYABLE)],
)
def test_exceptions(exc, kind):
    assert exception_ending(exc).kind is kind


def test_next_state_applies_cap_and_backoff():
    retry = Ending(Kind.RETRYABLE, "503")
    assert next_state(retry, 1, 5, BACKOFF, 0.5).state == "available"
    assert next_state(retry, 1, 5, BACKOFF, 0.5).delay == pytest.approx(15)
    assert next_state(retry, 3, 5, BACKOFF, 0.5).delay == pytest.approx(60)
    final = next_state(retry, 5, 5, BACKOFF, 0.5)
    assert (final.state, final.outcome) == ("dead", "dead")
    assert "attempt 5 of 5" in final.error
    assert next_state(Ending(Kind.PERMANENT, "x"), 1, 5, BACKOFF, 0.5).state == "dead"
    timeout = next_state(Ending(Kind.TIMEOUT, "t"), 1, 5, BACKOFF, 0.5)
    assert (timeout.state, timeout.outcome) == ("available", "timeout")


class Invoice(TypedDict):
    invoice_id: int
    note: NotRequired[str | None]


@dataclass
class Page:
    cursor: int


@pytest.mark.parametrize(
    ("shape", "payload", "ok"),
    [(Invoice, {"invoice_id": 1}, True), (Invoice, {"invoice_id": 1, "note": None}, True),
     (Invoice, {}, False), (Invoice, {"invoice_id": "1"}, False), (Invoice, {"invoice_id": True}, False),
     (Invoice, {"invoice_id": 1, "extra": 2}, False), (Invoice, [1], False),
     (Page, {"cursor": 3}, True), (Page, {"cursor": "3"}, False), (Page, {}, False),
     (Page, {"cursor": 1, "x": 1}, False)],
)
def test_payload_shapes(shape, payload, ok):
    if ok:
        check_shape(shape, payload)
    else:
        with pytest.raises(PayloadError):
            check_shape(shape, payload)


def test_shape_from_annotation_and_unknown_tasks():
    @task("tests.annotated")
    def annotated(payload: Invoice, ctx):
        return payload

    assert resolve("tests.annotated").shape is Invoice
    with pytest.raises(UnknownTask):
        resolve("no.such.name")
    with pytest.raises(UnknownTask):
        resolve("os:system")  # importable, but not marked as a handler: never called
    with pytest.raises(UnknownTask):
        resolve("no_such_module_xyz:f")


def spec(**kw):
    return ScheduleSpec(name="backup", timezone="UTC", misfire=Misfire.SKIP, every=60.0,
                        command=("/bin/true",), **kw)


def test_command_version_decisions():
    mine = spec()
    other = spec(timeout=5.0)
    assert decide("backup", 1, (mine.digest, True), mine).verdict is Verdict.RUN
    assert decide("backup", 1, (mine.digest, False), mine).verdict is Verdict.RUN
    wait = decide("backup", 1, (other.digest, True), mine)
    assert wait.verdict is Verdict.WAIT
    refuse = decide("backup", 1, (other.digest, False), mine)
    assert refuse.verdict is Verdict.REFUSE
    assert other.digest[:12] in refuse.reason and mine.digest[:12] in refuse.reason
    assert decide("backup", 1, (mine.digest, True), None).verdict is Verdict.REFUSE
    assert decide("backup", None, None, mine).verdict is Verdict.REFUSE
    assert decide(None, None, None, None).verdict is Verdict.REFUSE
    assert decide("backup", 7, None, mine).verdict is Verdict.REFUSE
