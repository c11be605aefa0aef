"""The served_by_xid variant's fold mark: a group the fold cannot take keeps its deltas
where the claim reads them. Run with the variant applied and the tests' fixtures:

    PYTHONPATH=. pytest -p bench.experiments.served_by_xid_plugin -p tests.conftest \
        bench/experiments/served_by_xid_test.py

(The mark must stay below a delta the fold left even when no older transaction is
running; on a shared database another session's older transaction often keeps it there
anyway, so this test cannot always tell the two apart.)"""
from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

SEEN = """
SELECT g.group_id, g.served_n + coalesce((
    SELECT sum(f.n) FROM {s}.fair_served f
    WHERE f.type = g.type AND f.group_id = g.group_id
      AND f.xid >= coalesce((SELECT max(m.upto) FROM {s}.fair_fold_mark m
                             WHERE m.type = g.type), '0')), 0) AS served,
       (SELECT count(*) FROM {s}.fair_served f WHERE f.group_id = g.group_id) AS deltas
FROM {s}.fair_groups g WHERE g.type = 't' ORDER BY 1"""

async def seen(aconn: Any, schema: str) -> list[tuple[Any, ...]]:
    cur = await aconn.execute(sql.SQL(SEEN).format(s=sql.Identifier(schema)))
    return [tuple(r) for r in await cur.fetchall()]

async def test_a_group_the_fold_skips_keeps_its_deltas_above_the_mark(
    queue: Queue, aconn: Any, schema: str, database_url: str
) -> None:
    for g in ("a", "b"):
        await queue.upsert_group(g, plan="free")
        for _ in range(2):
            await queue.enqueue("t", {}, group_id=g)
    jobs = await queue.claim("t", 2)
    assert sorted(j.group_id for j in jobs) == ["a", "b"]
    await queue.settle()  # the claim's own upkeep round folds both
    assert await seen(aconn, schema) == [("a", 1, 0), ("b", 1, 0)]
    s = sql.Identifier(schema)
    async with (await psycopg.AsyncConnection.connect(database_url) as folder,
                await psycopg.AsyncConnection.connect(database_url) as holder):
        # No fold until the group's row is held: the claim's deltas are older than the
        # holder's transaction, so only the leftover delta keeps the mark below them.
        await folder.execute(sql.SQL("SELECT 1 FROM {}.fair_fold_lock WHERE type = 't' "
                                     "FOR UPDATE").format(s))
        more = await queue.claim("t", 2)
        assert sorted(j.group_id for j in more) == ["a", "b"]
        await queue.settle()
        assert await seen(aconn, schema) == [("a", 2, 1), ("b", 2, 1)]
        # What an enqueuer of group a holds while its transaction is open.
        await holder.execute(sql.SQL("SELECT 1 FROM {}.fair_groups WHERE type = 't' AND "
                                     "group_id = 'a' FOR KEY SHARE").format(s))
        await folder.rollback()
        await queue.upkeep.run_once()
        # b folded, a left (its row is held): a's delta is still read, above the mark
        assert await seen(aconn, schema) == [("a", 2, 1), ("b", 2, 0)]
        await holder.rollback()
    await queue.upkeep.run_once()
    assert await seen(aconn, schema) == [("a", 2, 0), ("b", 2, 0)]
