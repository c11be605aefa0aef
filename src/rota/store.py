"""The one data-access seam: every statement rota runs goes through a :class:`Store`.

A statement is a file ``rota/sql/NAME.sql`` (one statement each, parameterized,
``{schema}`` and ``{groups}`` filled in with validated, quoted identifiers). The store
holds the queue's identifiers and its connection pool, and runs statements by name on
a pooled connection or on the caller's (``conn=``, inside the caller's transaction).
The queue, the claim, the runner, quotas, maintenance, the worker, the admin
operations and the web apps all call it; none of them holds SQL text
(docs/design.md, "Where things live").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import Composed, Identifier
from psycopg_pool import AsyncConnectionPool

from . import db

AnyConn = psycopg.AsyncConnection[Any]
Params = Mapping[str, Any]


class Statements:
    """The named statements of one queue: its schema and its groups relation.

    Args:
        schema: the schema holding rota's tables (validated by :func:`rota.db.identifier`).
        groups: ``None`` for rota's own ``SCHEMA.groups``, or an application's table or
            view (``"app.campaign_groups"``), validated the same way.

    Raises:
        InvalidInput: a name is not a valid identifier.
    """

    def __init__(self, schema: str, groups: str | None = None) -> None:
        self.schema = schema
        self.schema_ident = db.identifier(schema, "schema")
        self.groups_ident = (
            db.identifier(groups, "groups relation", qualified=True) if groups is not None
            else Identifier(schema, "groups"))
        self.external_groups = groups is not None

    def sql(self, name: str, **fragments: str) -> Composed:
        """The statement ``rota/sql/NAME.sql`` for this schema and groups relation, each
        ``{key}`` placeholder of ``fragments`` replaced by that named statement."""
        return db.statement(name, self.schema_ident, self.groups_ident, **fragments)

    def table(self, name: str) -> Identifier:
        """A table of this queue's schema, quoted."""
        return Identifier(self.schema, name)


class Store(Statements):
    """Runs the named statements of one queue on its pool or a caller's connection.

    Args:
        pool: the ``AsyncConnectionPool`` statements run on when no ``conn`` is given.
        schema, groups: see :class:`Statements`.
    """

    def __init__(self, pool: AsyncConnectionPool[Any], schema: str,
                 groups: str | None = None) -> None:
        super().__init__(schema, groups)
        self.pool = pool

    @asynccontextmanager
    async def connection(self, conn: AnyConn | None = None) -> AsyncIterator[AnyConn]:
        """Yield ``conn`` if given (the caller's transaction decides), else a pooled
        connection (committed when the block exits)."""
        if conn is not None:
            yield conn
            return
        async with self.pool.connection() as c:
            yield c

    async def execute(self, name: str, params: Params, *, conn: AnyConn | None = None,
                      prepare: bool | None = None) -> int:
        """Run the statement; return its row count (rows written, or -1)."""
        async with self.connection(conn) as c:
            cur = await c.execute(self.sql(name), params, prepare=prepare)
            return cur.rowcount

    async def fetch_one(self, name: str, params: Params, *,
                        conn: AnyConn | None = None) -> tuple[Any, ...] | None:
        """Run the statement; return its first row as a tuple, or ``None``."""
        async with self.connection(conn) as c:
            cur = c.cursor(row_factory=tuple_row)
            await cur.execute(self.sql(name), params)
            return await cur.fetchone()

    async def fetch_all(self, name: str, params: Params, *,
                        conn: AnyConn | None = None) -> list[tuple[Any, ...]]:
        """Run the statement; return every row as a tuple."""
        async with self.connection(conn) as c:
            cur = c.cursor(row_factory=tuple_row)
            await cur.execute(self.sql(name), params)
            return await cur.fetchall()

    async def fetch_dicts(self, name: str, params: Params, *,
                          conn: AnyConn | None = None) -> list[dict[str, Any]]:
        """Run the statement; return every row as a dict keyed by column name."""
        async with self.connection(conn) as c:
            cur = c.cursor(row_factory=dict_row)
            await cur.execute(self.sql(name), params)
            return await cur.fetchall()

    async def fetch_dict(self, name: str, params: Params, *,
                         conn: AnyConn | None = None) -> dict[str, Any] | None:
        """Run the statement; return its first row as a dict, or ``None``."""
        rows = await self.fetch_dicts(name, params, conn=conn)
        return rows[0] if rows else None


__all__ = ["AnyConn", "Statements", "Store"]
