"""Another role cannot stall or flood a queue's claim bookkeeping: the served window's
edge is coordinated by row locks on rota's own fair_edge table (docs/fast-claim.md,
"Writers: three protocols and one delta rule"), which only roles granted the schema can take. An
advisory lock, by contrast, any role of the database can take on any key."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from rota import Queue


@pytest.fixture
def two_roles(database_url: str) -> Iterator[tuple[str, str]]:
    """Two login roles, each owning one schema of its own (made by the test)."""
    names = [f"rota_role_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    dbname = conninfo_to_dict(database_url).get("dbname", "postgres")
    with psycopg.connect(database_url, autocommit=True) as c:
        for n in names:
            c.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(n)))
            c.execute(sql.SQL("GRANT CONNECT, CREATE ON DATABASE {} TO {}")
                      .format(sql.Identifier(str(dbname)), sql.Identifier(n)))
    try:
        yield names[0], names[1]
    finally:
        with psycopg.connect(database_url, autocommit=True) as c:
            for n in names:
                c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(n)))
                c.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(n)))
                c.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(n)))


def as_role(url: str, role: str) -> str:
    return make_conninfo(url, user=role)


def old_edge_key(schema: str, job_type: str) -> str:
    """The advisory key the baseline's fair_edge_key computed for a type: any role can
    compute it, and could take it."""
    return (f"SELECT (hashtext('rota.fair_edge:' || quote_ident('{schema}'))::bigint << 32)"
            f" | (hashtext('{job_type}')::bigint & 4294967295)")


async def _work(queue: Queue, n: int) -> None:
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": None} for _ in range(n)])
    await queue.upsert_group("g", plan=None)
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "g"} for _ in range(n)])
    while batch := await queue.claim("t", 10):
        assert all(await queue.complete_many(batch))
    counts = await queue.upkeep.run_once()  # moves the edge: needs its row lock
    assert counts["advanced"] == 1


async def test_neither_role_can_delay_the_others_queue(
    database_url: str, two_roles: tuple[str, str]
) -> None:
    a, b = two_roles
    queues = {r: Queue(as_role(database_url, r), schema=r) for r in (a, b)}
    for q in queues.values():
        await q.open()
        await q.migrate()
    try:
        for me, other in ((a, b), (b, a)):
            async with await psycopg.AsyncConnection.connect(
                    as_role(database_url, other), autocommit=True) as rogue:
                # Everything the other role could try on this queue: the advisory keys
                # rota used to compute, and rota's own rows.
                cur = await rogue.execute(old_edge_key(me, "t"))
                row = await cur.fetchone()
                assert row is not None
                await rogue.execute("SELECT pg_advisory_lock(%s)", [row[0]])
                await rogue.execute("SELECT pg_advisory_lock(hashtext('rota.migrate'),"
                                    " hashtext(%s))", [me])
                for table in ("fair_edge", "fair_groups", "fair_served", "fair_fold_lock", "jobs"):
                    async with rogue.transaction():
                        with pytest.raises(psycopg.errors.InsufficientPrivilege):
                            await rogue.execute(
                                sql.SQL("SELECT 1 FROM {}.{} FOR UPDATE")
                                .format(sql.Identifier(me), sql.Identifier(table)))
                # The queue's whole cycle, edge moves included, within a 3 s budget.
                await asyncio.wait_for(_work(queues[me], 30), timeout=3)
    finally:
        for q in queues.values():
            await q.close()
