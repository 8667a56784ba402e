"""Logging: one line per event that matters, as text or JSON; records carry `action` and, where
they apply, `schedule`, `scheduled_for` and `term`. A record logged with its exception (an
error cronkeeper survives and calls a bug: ``internal_error``, ``web_error``) carries the
traceback too: after the line in text, as ``traceback`` in JSON; it is what a bug report needs,
and those records are said once a minute at most (``say_survived``)."""

from __future__ import annotations

import json
import logging
import sys

from cronkeeper.outage import Repeats

FIELDS = ("action", "schedule", "scheduled_for", "term", "instance", "reason", "job_id", "owner",
          "source")


def _traceback(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    """The record's exception (and stack, if asked for) as ``logging`` prints them, or None."""
    if record.exc_info and not record.exc_text:
        record.exc_text = formatter.formatException(record.exc_info)
    parts = [p for p in (record.exc_text,
                         record.stack_info and formatter.formatStack(record.stack_info)) if p]
    return "\n".join(parts) or None


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} {record.levelname.lower()} {record.getMessage()}"
        extras = [f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) is not None]
        line = base + (" " + " ".join(extras) if extras else "")
        traceback = _traceback(self, record)
        return line if traceback is None else f"{line}\n{traceback}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, str | int | float] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                doc[key] = str(value) if not isinstance(value, int | float) else value
        traceback = _traceback(self, record)
        if traceback is not None:
            doc["traceback"] = traceback
        return json.dumps(doc)


def configure(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("cronkeeper")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def say_survived(log: logging.Logger, repeats: Repeats, who: str, step: str,
                 exc: BaseException, now: float) -> None:
    """An error a thread survives and goes on after (a bug): at ERROR with its traceback the
    first time, then once a minute while it repeats (``repeats`` decides; ``now`` monotonic)."""
    notice = repeats.failed(step, exc, now)
    if notice is not None:
        log.error("%s: %s failed: %s: %s (this is a bug in cronkeeper; going on, said once a "
                  "minute while it repeats: %d times in %.0fs)", who, step, type(exc).__name__,
                  exc, notice.failures, notice.lasted, exc_info=exc if notice.first else None,
                  extra={"action": "internal_error"})
