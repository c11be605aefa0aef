"""Migrations, the schema script, and the sync enqueue API."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import psycopg
from psycopg import sql

from rota import SyncQueue, schema_sql
from rota.db import migrate, migrations


async def test_concurrent_migrators_apply_each_version_once(
    database_url: str, schema: str, aconn: Any
) -> None:
    async def one() -> list[int]:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            return await migrate(c, schema)

    results = await asyncio.gather(*(one() for _ in range(4)))
    versions = [v for v, _, _ in migrations()]
    assert sorted(results, key=len) == [[], [], [], versions]
    cur = await aconn.execute(
        sql.SQL("SELECT version FROM {}.rota_migrations ORDER BY version")
        .format(sql.Identifier(schema)))
    assert [r[0] for r in await cur.fetchall()] == versions


def test_concurrent_migrate_processes(database_url: str, schema: str) -> None:
    cmd = [sys.executable, "-m", "rota.cli", "migrate", "--schema", schema,
           "--database-url", database_url]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    assert sum(o[0].startswith("applied") for o in outs) == 1


def test_schema_script_builds_the_same_schema(database_url: str, schema: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(schema_sql(schema).encode())
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "ORDER BY 1", [schema]).fetchall()
        assert {"groups", "jobs", "runs", "rota_migrations"} <= {t[0] for t in tables}
        got = conn.execute(sql.SQL("SELECT version FROM {}.rota_migrations ORDER BY 1")
                           .format(sql.Identifier(schema))).fetchall()
        assert [r[0] for r in got] == [v for v, _, _ in migrations()]


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
