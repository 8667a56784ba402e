"""The job context an ``async def`` handler receives: ``JobContext``'s fields and helpers, with
the database side awaitable, on a psycopg ``AsyncConnection`` (search_path = the schema).

    @task("mail.send")
    async def send(payload, ctx: AsyncJobContext):
        async with ctx.effect(f"mail:{payload['id']}") as first:
            if first:
                await mailer.send(..., idempotency_key=ctx.key)
        await ctx.enqueue("mail.next", {...}, key=...)      # exists iff this job completes
        conn = await ctx.connection()                        # the same transaction

The transaction is opened on first use and, as for a sync handler, the worker commits it
*together with the job's fenced completion*, or rolls it back when the handler raises, is
cancelled at its timeout, or lost its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from cronkeeper.db.effects import effects_claim_async
from cronkeeper.db.enqueue import enqueue_async
from cronkeeper.db.outbox_endings import outbox_complete_async
from cronkeeper.db.sessions import (
    AsyncConnection,
    async_connection_drop,
    async_connection_reusable,
    async_job_connection,
)
from cronkeeper.worker.context import JobFacts


@dataclass(eq=False)
class AsyncJobContext(JobFacts):
    """What an async handler knows about its job: key, attempt (from 1), schedule, scheduled_for."""

    on_open: Callable[[AsyncConnection], None] | None = field(default=None, repr=False)
    application_name: str = field(default="cronkeeper-worker", repr=False)
    _conn: AsyncConnection | None = field(default=None, repr=False)

    async def connection(self) -> AsyncConnection:
        """The job's transaction, committed with the job's completion (opened on first use)."""
        if self._conn is None:
            if self.engine is None:
                raise RuntimeError("this job context has no database")
            self._conn = _kept.take(self._key()) or await async_job_connection(
                self.engine, self.schema, self.application_name)
            if self.on_open is not None:
                self.on_open(self._conn)
        return self._conn

    def _key(self) -> tuple[str, str]:
        assert self.engine is not None
        return self.engine.url.render_as_string(hide_password=False), self.schema

    @property
    def in_transaction(self) -> bool:
        return self._conn is not None

    async def claim_effect(self, conn: AsyncConnection | None, name: str) -> bool:
        """Claim ``name`` once, in ``conn``'s transaction (None: the job's own transaction)."""
        return await effects_claim_async(conn if conn is not None else await self.connection(),
                                         self.schema, name, self.key)

    @contextlib.asynccontextmanager
    async def effect(self, name: str) -> AsyncIterator[bool]:
        """``async with ctx.effect("charge:42") as first:``; act only when ``first`` is True."""
        yield await self.claim_effect(None, name)

    async def enqueue(self, task: str, payload: dict[str, Any] | None = None, *, key: str,
                      **kwargs: Any) -> int | None:
        """A follow-up job, written in the job's transaction (exists iff this job completes)."""
        return await enqueue_async(await self.connection(), task, payload, key=key,
                                   schema=self.schema, **kwargs)

    async def complete(self, worker_id: str, *, output: bytes | None = None,
                       keep_output: bool = False) -> bool:
        """The fenced completion in the handler's transaction, then commit (see JobContext)."""
        assert self.job_id is not None
        done = await outbox_complete_async(await self.connection(), worker_id=worker_id,
                                           ids=[self.job_id], attempts=[self.attempt],
                                           outputs=[output] if keep_output else None,
                                           note=self.note)
        await self.finish(commit=bool(done))
        return bool(done)

    async def finish(self, commit: bool) -> None:
        """Commit or roll back the job's transaction and close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if commit:
                await conn.commit()
            else:
                await conn.rollback()
        except BaseException:
            await conn.close()
            raise
        if async_connection_reusable(conn):
            await _kept.keep(self._key(), conn)  # the next job on this loop starts at once
        else:
            await conn.close()

    def drop(self) -> None:
        """Close the connection without the event loop (a loop that will not run again)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            async_connection_drop(conn)


class _Kept(threading.local):
    """One idle connection per thread, for the next job on the same event loop (a runner
    thread's loop lives as long as the thread): no connection set-up per job. A connection of
    another loop, engine or schema is never handed out; it is dropped when replaced."""

    loop: asyncio.AbstractEventLoop | None = None
    key: tuple[str, str] | None = None
    conn: AsyncConnection | None = None

    def take(self, key: tuple[str, str]) -> AsyncConnection | None:
        conn, self.conn = self.conn, None
        if conn is None:
            return None
        if (self.loop is asyncio.get_running_loop() and self.key == key
                and async_connection_reusable(conn)):
            return conn
        async_connection_drop(conn)
        return None

    async def keep(self, key: tuple[str, str], conn: AsyncConnection) -> None:
        old, self.conn = self.conn, conn
        self.loop, self.key = asyncio.get_running_loop(), key
        if old is not None:
            async_connection_drop(old)

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            await conn.close()


_kept = _Kept()


async def close_kept() -> None:
    """Close this thread's idle connection (before its event loop ends)."""
    await _kept.close()
