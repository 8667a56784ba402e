"""``cronkeeper worker``: claim jobs from the outbox under a lease, run them (commands from the
worker's own schedule files, tasks through registered handlers), classify failures, retry with
backoff or dead-letter, and record every attempt.

Handlers::

    from cronkeeper.worker import task

    @task("billing.send_invoice", payload=InvoicePayload)
    def send_invoice(payload, ctx):
        with ctx.effect(f"invoice-mail:{payload['invoice_id']}") as first:
            if first:
                mailer.send(..., idempotency_key=ctx.key)

``async def`` handlers get an ``AsyncJobContext`` (awaitable connection, effect and enqueue);
``@task(..., isolation="process")`` or ``cronkeeper worker --isolation process`` runs handlers
in pooled child processes killed at their timeout (see docs/worker.md).
"""

from cronkeeper.errors import PermanentError
from cronkeeper.worker.async_context import AsyncJobContext
from cronkeeper.worker.context import JobContext
from cronkeeper.worker.registry import PayloadError, UnknownTask, task

__all__ = ["AsyncJobContext", "JobContext", "PayloadError", "PermanentError", "UnknownTask", "task"]
