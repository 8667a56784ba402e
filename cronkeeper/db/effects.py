"""The ``effects`` table: the idempotency helper's statement, claiming an effect once in the
caller's transaction (a sync connection, or an ``async def`` handler's async one)."""

from __future__ import annotations

import psycopg
import sqlalchemy as sa

from cronkeeper.db.engine import check_schema_name, translate_errors

_CLAIM_EFFECT = """
INSERT INTO "{schema}".effects (key, job_key) VALUES (%(key)s, %(job)s)
ON CONFLICT (key) DO NOTHING RETURNING key
"""


def effects_claim(conn: sa.Connection | psycopg.Connection, schema: str, name: str, job_key: str | None) -> bool:
    """Insert the effect's key in the caller's transaction: True the first time only."""
    sql = _CLAIM_EFFECT.format(schema=check_schema_name(schema))
    params = {"key": name, "job": job_key}
    with translate_errors("claiming an effect"):
        if isinstance(conn, sa.Connection):
            return conn.exec_driver_sql(sql, params).fetchone() is not None
        return conn.execute(sql, params).fetchone() is not None


async def effects_claim_async(
    conn: psycopg.AsyncConnection, schema: str, name: str, job_key: str | None
) -> bool:
    """``effects_claim`` on an async connection: True the first time only."""
    sql = _CLAIM_EFFECT.format(schema=check_schema_name(schema))
    with translate_errors("claiming an effect"):
        cur = await conn.execute(sql, {"key": name, "job": job_key})
        return await cur.fetchone() is not None
