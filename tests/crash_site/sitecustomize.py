"""Imported at start-up (through ``PYTHONPATH``) only by the relays that
``relay_helpers.spawn_relay(..., kill_after_publish=N)`` starts; nothing else puts this folder
on the path. It SIGKILLs the relay once N jobs were published and before the round's marks are
recorded: the crash window between publish and mark that docs/relay.md describes. The fault is
injected here, in the tests, so that production code carries no test hook."""

from __future__ import annotations

import os
import signal

_AFTER = int(os.environ.get("CRONKEEPER_TEST_RELAY_KILL_AFTER_PUBLISH", "0") or 0)

if _AFTER:
    from cronkeeper.relay.recorder import Recorder

    _put = Recorder.put
    _published = 0

    def _put_or_die(self: Recorder, outcome) -> None:
        global _published
        _published += len(outcome.published)
        if _published >= _AFTER:
            os.kill(os.getpid(), signal.SIGKILL)
        _put(self, outcome)

    Recorder.put = _put_or_die
