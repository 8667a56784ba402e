"""The job context a handler receives, and the idempotency helper.

``ctx.connection`` is a transaction on the cronkeeper database, opened on first use. The worker
commits it *together with the job's completion* (a fenced UPDATE of the job's row), or rolls it
back when the handler raises or the worker lost the job's lease. So, inside it:

- ``with ctx.effect("charge:42") as first:`` claims the effect key under the unique constraint
  of ``effects``; ``first`` is False when the effect was already claimed (committed by an earlier
  run). A concurrent run of the same job blocks on the key until the first commits or rolls back.
- ``ctx.claim_effect(conn, name) -> bool`` does the same in any transaction of the caller's own
  (``conn``: SQLAlchemy or psycopg connection to the database holding the cronkeeper schema).
- ``ctx.enqueue(task, payload, key=...)`` writes a follow-up job that exists iff the job completes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cronkeeper.db.effects import effects_claim
from cronkeeper.db.engine import (
    DRIVER_ERRORS,
    Connection,
    Engine,
    RawConnection,
    translate_errors,
)


@dataclass(eq=False)
class JobFacts:
    """What every handler's context knows about its job, sync or async: key, attempt (from 1),
    schedule, scheduled_for, and where its transaction comes from."""

    key: str
    attempt: int
    schedule: str | None
    scheduled_for: datetime | None
    task: str = ""
    job_id: int | None = None
    schema: str = "cronkeeper"
    engine: Engine | None = field(default=None, repr=False)
    # The completion notes a recovery (the schema has the notifications tables: migrations/0013).
    note: bool = field(default=False, repr=False)


@dataclass(eq=False)
class JobContext(JobFacts):
    """What a handler knows about its job: key, attempt (from 1), schedule, scheduled_for."""

    on_open: Callable[[Connection], None] | None = field(default=None, repr=False)
    _conn: Connection | None = field(default=None, repr=False)

    @property
    def connection(self) -> Connection:
        """A transaction committed with the job's completion (opened on first use)."""
        if self._conn is None:
            if self.engine is None:
                raise RuntimeError("this job context has no database")
            with translate_errors("opening the job's transaction"):
                self._conn = self.engine.connect()
            if self.on_open is not None:
                self.on_open(self._conn)
        return self._conn

    @property
    def in_transaction(self) -> bool:
        return self._conn is not None

    def claim_effect(self, conn: Connection | RawConnection | None, name: str) -> bool:
        """Claim ``name`` once, in ``conn``'s transaction (None: the job's own transaction)."""
        return effects_claim(conn if conn is not None else self.connection, self.schema, name, self.key)

    @contextlib.contextmanager
    def effect(self, name: str) -> Iterator[bool]:
        """``with ctx.effect("charge:42") as first:``; act only when ``first`` is True. For an
        effect outside the database, also pass ``ctx.key`` (or ``name``) to the provider as its
        idempotency key: the claim commits only after the handler returns."""
        yield self.claim_effect(None, name)

    def enqueue(self, task: str, payload: dict[str, Any] | None = None, *, key: str, **kwargs: Any) -> int | None:
        """A follow-up job, written in the job's transaction (exists iff this job completes)."""
        from cronkeeper.db.enqueue import enqueue

        return enqueue(self.connection, task, payload, key=key, schema=self.schema, **kwargs)

    def complete(self, worker_id: str, *, output: bytes | None = None,
                 keep_output: bool = False) -> bool:
        """The job's fenced completion in the handler's transaction, then commit: True when
        committed; False when the fence refused it (lease lost), everything rolled back.
        Raises when the statement or the commit fails (the caller rolls back). With
        ``keep_output`` (the schema keeps it) the attempt's ``output`` is written with it."""
        from cronkeeper.db.outbox_endings import outbox_complete

        assert self.job_id is not None
        done = outbox_complete(self.connection, worker_id=worker_id, ids=[self.job_id],
                               attempts=[self.attempt],
                               outputs=[output] if keep_output else None, note=self.note)
        self.finish(commit=bool(done))
        return bool(done)

    def finish(self, commit: bool) -> None:
        """Commit or roll back the job's transaction and close it (the worker calls this).

        A failed commit raises (the attempt failed). A failed rollback does not: it fails when
        the connection is gone, and then the server has already discarded the transaction;
        raising would only kill the job's thread with the job still held (and heartbeated)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if commit:
                conn.commit()
            else:
                try:
                    conn.rollback()
                except DRIVER_ERRORS:
                    conn.invalidate()  # the pool must not hand this connection out again
        finally:
            with contextlib.suppress(*DRIVER_ERRORS):
                conn.close()
