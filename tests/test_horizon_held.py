"""While a long transaction holds the xmin horizon the claim walks its groups in one
sorted pass (src/rota/fair/claim_pool_sorted.sql; docs/operations.md, "Long
transactions"): the upkeep's loop notices the held horizon, the claim switches
statement and stays the oracle's, and switches back once the transaction ends."""

from __future__ import annotations

import asyncio

import psycopg
from psycopg import sql

from rota import Queue
from rota.fair import UpkeepConfig

from .test_fast_claim import claim_equals_oracle


async def look(queue: Queue) -> bool:
    """Claim nothing of a type with no job (a request for an upkeep round), let the
    loop run it and look at the horizon, and return what it found."""
    await queue.claim("none", 1)
    await queue.upkeep.settle()
    return queue.upkeep.horizon_held


async def test_the_claim_walks_in_one_sorted_pass_while_the_horizon_is_held(
        queue: Queue, database_url: str) -> None:
    queue.upkeep.config = UpkeepConfig(horizon_every=1e-6, held_after=1.0)
    for g, plan in (("a", "pro"), ("b", "pro"), ("c", "free"), ("d", None)):
        await queue.upsert_group(g, plan=plan)
        for _ in range(3):
            await queue.enqueue("t", {}, group_id=g)
    assert not await look(queue)
    cached = queue.fair_claim.statement().text
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}.jobs")
                             .format(sql.Identifier(queue.schema)))
        await asyncio.sleep(1.2)
        assert await look(queue)
        sorted_pass = queue.fair_claim.statement().text
        assert "PARTITION BY f.plan" in sorted_pass and "PARTITION BY f.plan" not in cached
        for limit in (1, 4, 7):
            await claim_equals_oracle(queue, database_url, "t", limit)
        for j in await queue.claim("t", 5):
            await queue.complete(j)
        await claim_equals_oracle(queue, database_url, "t", 3)
        await holder.rollback()
    # Other tests' transactions on this database may be old too: wait for the horizon.
    for _ in range(100):
        if not await look(queue):
            break
        await asyncio.sleep(0.1)
    assert queue.upkeep.horizon_held is False
    assert queue.fair_claim.statement().text == cached
    await claim_equals_oracle(queue, database_url, "t", 4)
    assert await queue.verify() == []

