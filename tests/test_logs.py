"""The log formatters (cronkeeper.logs): an error logged with its exception carries its
traceback, in text after the line and in JSON as ``traceback``. Before, both formatters dropped
it: "said with its traceback once" (a worker's supervisor, a daemon's housekeeping, the
notification sender) and the web's internal errors reached the log as one line naming nothing
to look at."""

from __future__ import annotations

import json
import logging

from cronkeeper.logs import JsonFormatter, TextFormatter


def _record(with_exception: bool) -> logging.LogRecord:
    try:
        {}["schedules_digest"]  # noqa: B018 - the bug being logged
    except KeyError as exc:
        error = exc
    record = logging.getLogger("cronkeeper.test").makeRecord(
        "cronkeeper.test", logging.ERROR, __file__, 1, "housekeeping: %s failed", ("a step",),
        (type(error), error, error.__traceback__) if with_exception else None,
        extra={"action": "internal_error"})
    return record


def test_text_puts_the_traceback_after_the_line():
    text = TextFormatter().format(_record(True))
    line, *rest = text.splitlines()
    assert line.endswith("error housekeeping: a step failed action=internal_error")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "KeyError: 'schedules_digest'"
    assert any("test_logs.py" in r for r in rest)


def test_json_keeps_one_line_with_the_traceback_as_a_field():
    text = JsonFormatter().format(_record(True))
    assert "\n" not in text
    doc = json.loads(text)
    assert doc["message"] == "housekeeping: a step failed"
    assert doc["action"] == "internal_error"
    assert doc["traceback"].startswith("Traceback (most recent call last):")
    assert doc["traceback"].endswith("KeyError: 'schedules_digest'")


def test_a_record_without_an_exception_is_one_line_without_a_traceback_field():
    assert "\n" not in TextFormatter().format(_record(False))
    assert "traceback" not in json.loads(JsonFormatter().format(_record(False)))
