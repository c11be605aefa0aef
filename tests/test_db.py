"""The sync enqueue API (migrations: test_migrations.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

from rota import SyncQueue


async def test_sync_enqueue_inside_callers_transaction(
    database_url: str, queue: Any, aconn: Any
) -> None:
    sq = SyncQueue(schema=queue.schema)

    def work() -> tuple[Any, Any, int]:
        with psycopg.connect(database_url) as conn:
            job = sq.enqueue(conn, "t", {"a": 1}, dedupe_key="k")
            dup = sq.enqueue(conn, "t", {"a": 2}, dedupe_key="k")
            n = sq.enqueue_many(conn, [{"type": "t", "payload": {}}] * 2)
            conn.rollback()
            job = sq.enqueue(conn, "t", {"a": 3}, dedupe_key="k")
            conn.commit()
        return job, dup, n

    job, dup, n = await asyncio.to_thread(work)
    assert dup is None and n == 2 and job.payload == {"a": 3}
    cur = await aconn.execute(f'SELECT count(*) FROM "{queue.schema}".jobs')
    assert (await cur.fetchone())[0] == 1
