"""The election publishes its signals in order (issue 19): for each term, GAINED then LOST; on a
graceful stop the old leader's LOST comes before the new leader's GAINED; a leader whose lock
session is killed publishes LOST and comes back as a standby (CONNECTED), while the standby
takes over with the next term. Two and three nodes in this process on a real PostgreSQL, each
leading with a minimal loop: confirm the term, report progress, until stopped."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from conftest import libpq_url
from daemon_harness import wait_for

from cronkeeper.db.engine import normalize_url
from cronkeeper.election import Node, Role, Signal
from cronkeeper.term import Term

WAIT = 15.0


def _lead(term: Term) -> None:
    """What the leader's loop owes the election: fenced work, progress, return when stopped."""
    while not term.stopping.wait(0.05):
        with term.conn.transaction():
            term.confirm()
        term.progress()


class Recorder:
    """Every signal of every node, in the order published (appends are atomic)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Signal, int | None]] = []

    def of(self, name: str) -> list[tuple[Signal, int | None]]:
        return [(s, t) for n, s, t in self.events if n == name]

    def terms(self) -> list[tuple[str, Signal, int | None]]:
        return [e for e in self.events if e[1] in (Signal.GAINED, Signal.LOST)]


@pytest.fixture
def nodes(database_url, schema, cluster, engine) -> Iterator:
    recorder = Recorder()
    started: list[tuple[Node, threading.Thread]] = []

    def start(name: str) -> Node:
        node = Node(url=normalize_url(database_url), schema=schema, cluster=cluster,
                    engine=engine, instance_id=f"{cluster}-{name}", lead=_lead,
                    schedules_digest=lambda: "none")
        node.signals.listen(lambda signal, term: recorder.events.append((name, signal, term)))
        thread = threading.Thread(target=node.run, name=f"node-{name}", daemon=True)
        thread.start()
        started.append((node, thread))
        return node

    yield start, recorder
    for node, _ in started:
        node.request_stop()
    for node, thread in started:
        thread.join(WAIT)
        assert not thread.is_alive(), f"{node.instance_id} did not stop"


def test_a_graceful_takeover_publishes_the_old_leaders_loss_before_the_new_gain(nodes) -> None:
    start, recorder = nodes
    a = start("a")
    assert a.signals.leading.wait(WAIT)
    b = start("b")
    assert b.signals.connected.wait(WAIT)
    assert not b.signals.leading.is_set() and b.role is Role.STANDBY

    a.request_stop()
    assert b.signals.leading.wait(WAIT)
    assert a.signals.finished.wait(WAIT)
    assert not a.signals.leading.is_set() and a.role is Role.STOPPED
    first = a.term
    assert first is not None and b.term == first + 1
    assert recorder.terms() == [("a", Signal.GAINED, first), ("a", Signal.LOST, first),
                                ("b", Signal.GAINED, first + 1)]
    assert recorder.of("a") == [(Signal.CONNECTED, None), (Signal.GAINED, first),
                                (Signal.LOST, first), (Signal.FINISHED, first)]


def test_a_killed_lock_session_publishes_lost_and_the_standby_gains_the_next_term(
        nodes, database_url, cluster) -> None:
    start, recorder = nodes
    b = start("b")
    assert b.signals.leading.wait(WAIT)
    c = start("c")
    assert c.signals.connected.wait(WAIT)
    term = b.term
    assert term is not None
    with psycopg.connect(libpq_url(database_url), autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s", (f"cronkeeper-lock:{cluster}-b",)).fetchone()
    assert killed == (1,)
    assert c.signals.leading.wait(WAIT)
    assert c.term == term + 1
    # b noticed at its next confirm, said LOST, and waits as a standby on a new session
    wait_for(lambda: b.role is Role.STANDBY and recorder.of("b").count(
        (Signal.CONNECTED, term)) == 1, WAIT, "b back as a standby")
    assert not b.signals.leading.is_set()
    assert recorder.of("b")[:3] == [(Signal.CONNECTED, None), (Signal.GAINED, term),
                                    (Signal.LOST, term)]
    assert recorder.of("c")[-1] == (Signal.GAINED, term + 1)
    gains = [t for _, s, t in recorder.terms() if s is Signal.GAINED]
    assert gains == sorted(set(gains)), "each GAINED has a term of its own, in order"
