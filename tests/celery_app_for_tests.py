"""The team's Celery app, as the relay tests and docs/celery.md imagine it: unchanged tasks, plus
the consumer-side dedupe recipe of docs/celery.md (#dedupe). Configured from the environment the
tests give the ``celery worker`` process (CK_TEST_*)."""

from __future__ import annotations

import os
import time

import psycopg
from celery import Celery

app = Celery("ck_tests", broker=os.environ.get("CK_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//"),
             backend=os.environ.get("CK_TEST_BACKEND") or None)
app.conf.task_default_queue = os.environ.get("CK_TEST_QUEUE", "celery")
app.conf.task_track_started = True
app.conf.worker_prefetch_multiplier = 1
app.conf.broker_connection_retry_on_startup = True
# What the team had before cronkeeper (docs/celery.md turns it into a schedule file).
app.conf.beat_schedule = {
    "tick": {"task": "billing.record", "schedule": 1.0, "kwargs": {"source": "beat"}},
}


def _connect() -> psycopg.Connection:
    conn = psycopg.connect(os.environ["CK_TEST_DB_URL"])
    conn.execute(f'SET search_path TO "{os.environ["CK_TEST_SCHEMA"]}"')
    conn.commit()
    return conn


def _log_delivery(conn: psycopg.Connection, request, started: float, finished: float) -> None:
    conn.execute(
        "INSERT INTO celery_deliveries (task_id, key_header, schedule_header, scheduled_for_header,"
        " started_at, finished_at) VALUES (%s, %s, %s, %s, to_timestamp(%s), to_timestamp(%s))",
        (request.id, getattr(request, "idempotency_key", None),
         getattr(request, "cronkeeper_schedule", None),
         getattr(request, "cronkeeper_scheduled_for", None), started, finished),
    )


@app.task(bind=True, name="billing.record")
def record(self, **payload):
    """The effect happens once per task id, however often the message is delivered."""
    started = time.time()
    with _connect() as conn:
        # docs/celery.md, dedupe recipe: claim the task id (= cronkeeper's idempotency key) and
        # make the effect in ONE transaction; a second delivery finds the claim and does nothing.
        with conn.transaction():
            claimed = conn.execute(
                "INSERT INTO task_effects (key) VALUES (%s) ON CONFLICT DO NOTHING RETURNING key",
                (self.request.id,),
            ).fetchone()
            if claimed is not None:
                conn.execute("INSERT INTO invoices_sent (key, payload) VALUES (%s, %s)",
                             (self.request.id, psycopg.types.json.Jsonb(payload)))
        with conn.transaction():
            _log_delivery(conn, self.request, started, time.time())
    return "done" if claimed else "duplicate"


@app.task(bind=True, name="billing.slow")
def slow(self, **payload):
    started = time.time()
    time.sleep(float(os.environ.get("CK_TEST_SLOW_SECONDS", "3")))
    with _connect() as conn, conn.transaction():
        _log_delivery(conn, self.request, started, time.time())
    return "slow done"
