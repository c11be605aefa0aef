"""Test fixtures: a real PostgreSQL (DATABASE_URL, or an embedded throwaway server) and a
fresh schema per test, so tests run in parallel and never see each other's rows."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota.db import migrate


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """DATABASE_URL when set; otherwise one embedded server per test process."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    from rota.db import EmbeddedServer

    server = EmbeddedServer()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def schema(database_url: str) -> Iterator[str]:
    """A unique schema name for this test, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def migrated(database_url: str, schema: str) -> str:
    """This test's schema, migrated (for sync tests such as hypothesis properties)."""

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            await migrate(c, schema)

    asyncio.run(go())
    return schema


@pytest.fixture
async def make_queue(database_url: str, schema: str) -> AsyncIterator[Any]:
    """Factory for migrated queues on this test's schema (all closed at teardown)."""
    made: list[Queue] = []

    async def make(**settings: Any) -> Queue:
        q = Queue(database_url, schema=schema, **settings)
        await q.open()
        await q.migrate()
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


@pytest.fixture
async def queue(make_queue: Any) -> Queue:
    q: Queue = await make_queue()
    return q


@pytest.fixture
async def aconn(database_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A separate autocommit connection for assertions straight from the tables."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        yield c
