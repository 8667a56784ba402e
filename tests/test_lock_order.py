"""The heartbeat's lease extension and the recorder's endings over the same jobs never deadlock.
The endings are given their jobs in ascending id order, which an outbox of any size walks by
primary key; and the heartbeat never waits for a job another transaction holds (SKIP LOCKED),
so it takes part in no lock cycle even where the ending's plan locks rows in physical order (a
small or fresh outbox, scanned whole). (Workers met "deadlock detected" between a heartbeat and
an ending, said as "database unavailable": retried, nothing lost, but each one a round trip and
a line that sends an operator to look at a healthy database; seen again in a fresh schema in
benchmarks/output_capture.py after the ids were sorted.)"""

from __future__ import annotations

import threading

import psycopg
import pytest
from conftest import libpq_url
from daemon_harness import wait_for

from cronkeeper.db import outbox_claims as claims
from cronkeeper.db import outbox_endings as endings


def _held_jobs(engine) -> list[claims.OutboxJob]:
    """Two running jobs, in an outbox as big as a real one, so that the plan walks the ids
    given by primary key, in their order, as in production (a two-row table is scanned whole,
    in physical order, whatever the statement says)."""
    with engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO outbox (idempotency_key, task, state) SELECT 'filler' "
                             "|| g, 't', 'succeeded' FROM generate_series(1, 5000) g")
        for key in ("a", "b"):
            conn.exec_driver_sql("INSERT INTO outbox (idempotency_key, schedule, task) VALUES "
                                 "(%(k)s, %(k)s, 't')", {"k": key})
        conn.exec_driver_sql("ANALYZE outbox")
    with engine.begin() as conn:
        return sorted(claims.outbox_claim(conn, worker_id="w1", limit=10, lease_margin=30),
                      key=lambda j: j.id)


def locks_lower_first(engine, database_url, schema, run) -> bool:
    """Whether ``run(high, low)`` has locked ``low`` by the time it waits for ``high``, which
    another session holds meanwhile."""
    low, high = _held_jobs(engine)
    url = libpq_url(database_url)
    with psycopg.connect(url) as holder, psycopg.connect(url, autocommit=True) as probe:
        for conn in (holder, probe):
            conn.execute(f'SET search_path TO "{schema}"')
        holder.execute("SELECT 1 FROM outbox WHERE id = %s FOR UPDATE", (high.id,))
        thread = threading.Thread(target=run, args=(high, low))
        thread.start()
        try:
            wait_for(lambda: probe.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%%outbox%%' AND pid <> pg_backend_pid()").fetchone()[0], 20,
                "the statement to wait for the held job")
            try:
                probe.execute("SELECT 1 FROM outbox WHERE id = %s FOR UPDATE NOWAIT", (low.id,))
                locked = False
            except psycopg.errors.LockNotAvailable:
                locked = True
        finally:
            holder.rollback()
            thread.join(20)
    assert not thread.is_alive()
    return locked


@pytest.mark.parametrize("statement", ["fail", "complete"])
def test_endings_lock_jobs_in_ascending_id_order(engine, database_url, schema, statement):
    def run(first, second):
        with engine.begin() as conn:
            if statement == "fail":
                endings.outbox_fail(conn, worker_id="w1", failures=[
                    endings.Failure(j.id, j.attempt, "dead", 0.0, "boom", "dead")
                    for j in (first, second)])
            else:
                endings.outbox_complete(conn, worker_id="w1", ids=[first.id, second.id],
                                        attempts=[first.attempt, second.attempt])

    assert locks_lower_first(engine, database_url, schema, run)


def test_the_heartbeat_never_waits_for_a_job_an_ending_holds_so_no_cycle_forms(
        engine, database_url, schema):
    """An ending that locks the higher job first (as a plan in physical order does), the
    heartbeat over both, then the ending reaching for the lower one: before, the heartbeat held
    the lower job waiting for the higher, and one of the two met "deadlock detected". Now the
    heartbeat extends the lower job only, at once, and the ending goes on."""
    low, high = _held_jobs(engine)
    url = libpq_url(database_url)
    with psycopg.connect(url) as ending:
        ending.execute(f'SET search_path TO "{schema}"')
        ending.execute("SET lock_timeout = '20s'")
        endings.outbox_complete(ending, worker_id="w1", ids=[high.id], attempts=[high.attempt])
        extended: list[list[int]] = []
        failures: list[BaseException] = []

        def heartbeat() -> None:
            try:
                with engine.begin() as conn:
                    conn.exec_driver_sql("SET LOCAL lock_timeout = '20s'")
                    extended.append(claims.outbox_lease_extend(
                        conn, worker_id="w1", ids=[low.id, high.id],
                        attempts=[low.attempt, high.attempt], margin=30))
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failures.append(exc)

        thread = threading.Thread(target=heartbeat)
        thread.start()
        thread.join(20)
        assert not thread.is_alive(), "the heartbeat waited for the job the ending holds"
        assert failures == [] and extended == [[low.id]]
        done = endings.outbox_complete(ending, worker_id="w1", ids=[low.id],
                                       attempts=[low.attempt])
        ending.commit()
    assert done == [low.id]
