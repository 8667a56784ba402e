"""What a node of the election (``election.Node``) is and says, apart from how it elects: its
``Role``, the ``Signal`` it publishes to its listeners and the ``Signals`` they wait on
(``election``'s docstring says when each comes), and its ``NodeOptions``. The daemon, its
readiness and its metrics read these; ``election`` re-exports them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    CONNECTING = "connecting"
    STANDBY = "standby"
    LEADER = "leader"
    STOPPED = "stopped"


class Signal(StrEnum):
    """What the node publishes to its listeners (see the module's docstring)."""

    CONNECTED = "connected"  # a lock session is up: STANDBY
    GAINED = "gained"  # the lock is granted and the term recorded: LEADER
    LOST = "lost"  # the term's leadership ended (stopped, lost, stepped down)
    FINISHED = "finished"  # the node's thread has ended: STOPPED


@dataclass(frozen=True, slots=True)
class NodeOptions:
    leader_timeout: float = 10.0  # a leader silent this long is deposed
    stall_timeout: float = 10.0  # a leader whose work makes no progress this long steps down
    housekeeping_interval: float = 1.0
    instance_heartbeat_interval: float = 2.0


class Signals:
    """What a node publishes (see the module's docstring): Events to wait on, and listeners
    called with each signal in the order they happen."""

    def __init__(self) -> None:
        self.connected = threading.Event()
        self.leading = threading.Event()
        self.finished = threading.Event()
        self._listeners: list[Callable[[Signal, int | None], None]] = []

    def listen(self, listener: Callable[[Signal, int | None], None]) -> None:
        """Call ``listener(signal, term)`` for each signal from now on, on the node's threads:
        it must be quick and must not raise."""
        self._listeners.append(listener)

    def publish(self, signal: Signal, term: int | None) -> None:
        if signal is Signal.CONNECTED:
            self.connected.set()
        elif signal is Signal.GAINED:
            self.leading.set()
        elif signal is Signal.LOST:
            self.leading.clear()
        else:
            self.finished.set()
        for listener in self._listeners:
            listener(signal, term)
