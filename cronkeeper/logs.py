"""Logging: one line per event that matters, as text or JSON; records carry `action` and, where
they apply, `schedule`, `scheduled_for` and `term`."""

from __future__ import annotations

import json
import logging
import sys

FIELDS = ("action", "schedule", "scheduled_for", "term", "instance", "reason", "job_id", "owner",
          "source")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record, '%Y-%m-%dT%H:%M:%S')} {record.levelname.lower()} {record.getMessage()}"
        extras = [f"{k}={getattr(record, k)}" for k in FIELDS if getattr(record, k, None) is not None]
        return base + (" " + " ".join(extras) if extras else "")


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
        return json.dumps(doc)


def configure(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("cronkeeper")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
