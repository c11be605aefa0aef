"""Small helpers several test files share: enqueueing numbered jobs, reading a job's
state straight from the table, and polling until a condition holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue
from rota.db import _VERSION_TABLE, _record, migrations
from rota.fair import Violation
from rota.store import Statements


async def enqueue_jobs(queue: Queue, job_type: str, n: int, **kw: Any) -> list[int]:
    """Enqueue ``n`` jobs of ``job_type`` with payloads ``{"i": 0}``, ``{"i": 1}``, …;
    their ids, in order."""
    ids = []
    for i in range(n):
        job = await queue.enqueue(job_type, {"i": i}, **kw)
        assert job is not None
        ids.append(job.id)
    return ids


async def job_state(aconn: psycopg.AsyncConnection[Any], queue: Queue,
                    job_id: int) -> tuple[Any, ...]:
    """(status, attempts, last_error, run_after - now()) of one job."""
    cur = await aconn.execute(sql.SQL(
        "SELECT status, attempts, last_error, run_after - now() FROM {} WHERE id = %s")
        .format(queue.table("jobs")), [job_id])
    row = await cur.fetchone()
    assert row is not None
    return tuple(row)


def wait_for(check: Callable[[], Any], timeout: float = 20, what: str = "the check",
             interval: float = 0.05) -> Any:
    """Call ``check`` until it returns something true (returned), for ``timeout`` seconds
    at most."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


async def fair_violations(conn: psycopg.AsyncConnection[Any],
                          schema: str) -> list[Violation]:
    """The fair claim's contract (src/rota/fair/verify.sql) on ``conn``, inside whatever
    transaction it has open (timestamps in its session's TimeZone)."""
    cur = await conn.execute(Statements(schema).sql("fair/verify"))
    return [Violation(*row) for row in await cur.fetchall()]


async def index_entries_returned(conn: psycopg.AsyncConnection[Any], index: str) -> int:
    """The entries ``index`` (schema-qualified) has returned to ``conn``'s open
    transaction so far, dead versions' included (what a scan read, not what it kept)."""
    cur = await conn.execute("SELECT pg_stat_get_xact_tuples_returned(%s::regclass)",
                             [index])
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def schema_before(conn: psycopg.Connection[Any], schema: str, version: int) -> None:
    """Create ``schema`` as an install of every migration before ``version`` left it,
    each recorded as applied (an upgrade test's starting point; ``migrate`` then
    applies ``version`` and later)."""
    ident = sql.Identifier(schema)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(_VERSION_TABLE.format(schema=ident.as_string(conn)).encode())
        for m in migrations():
            if m.version < version:
                conn.execute(m.text.format(schema=ident.as_string(conn)).encode())
                conn.execute(_record(m, ident))
