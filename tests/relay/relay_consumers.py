"""RQ handlers the relay tests' real ``rq worker`` runs. Each run appends one line,
``<idempotency key> <payload as JSON>``, to the file named by RELAY_EFFECTS (O_APPEND: one
write per line, so concurrent workers do not interleave)."""

from __future__ import annotations

import json
import os

from rq import get_current_job


def _append(line: str) -> None:
    fd = os.open(os.environ["RELAY_EFFECTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def record(**payload) -> str:
    key = get_current_job().meta["idempotency_key"]
    _append(f"{key} {json.dumps(payload, sort_keys=True)}")
    return key


def fail(**payload) -> None:
    raise RuntimeError(f"handler failed on purpose: {payload}")
