"""While a long transaction holds the xmin horizon the claim walks its groups in one
sorted pass (src/rota/fair/claim_pool_sorted.sql; docs/operations.md, "Long
transactions"): the upkeep's loop notices the held horizon, the claim switches
statement and stays the oracle's, and switches back once the transaction ends."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota.fair import FairClaim, UpkeepConfig

from .helpers import pin_walk
from .test_fast_claim import claim_equals_oracle


async def look(queue: Queue) -> bool:
    """Claim nothing of a type with no job (a request for an upkeep round), let the
    loop run it and look at the horizon, and return what it found."""
    await queue.claim("none", 1)
    await queue.upkeep.settle()
    return queue.upkeep.horizon_held


async def horizon_moves(queue: Queue) -> bool:
    """Whether the horizon is found moving within 30 s: other sessions on this database
    (other tests, a report) may hold it for a while themselves."""
    for _ in range(300):
        if not await look(queue):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_the_claim_walks_in_one_sorted_pass_while_the_horizon_is_held(
        queue: Queue, database_url: str) -> None:
    queue.upkeep.config = UpkeepConfig(horizon_every=1e-6, held_after=1.0)
    for g, plan in (("a", "pro"), ("b", "pro"), ("c", "free"), ("d", None)):
        await queue.upsert_group(g, plan=plan)
        for _ in range(3):
            await queue.enqueue("t", {}, group_id=g)
    assert await horizon_moves(queue)
    cached = queue.fair_claim.statement().text
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}.jobs")
                             .format(sql.Identifier(queue.schema)))
        await asyncio.sleep(1.2)
        assert await look(queue)
        sorted_pass = queue.fair_claim.statement().text
        marker = "sorted_plans AS ("  # the sorted pass's one read of the groups
        assert marker in sorted_pass and marker not in cached
        for limit in (1, 4, 7):
            await claim_equals_oracle(queue, database_url, "t", limit)
        for j in await queue.claim("t", 5):
            await queue.complete(j)
        await claim_equals_oracle(queue, database_url, "t", 3)
        await holder.rollback()
    assert await horizon_moves(queue)
    assert queue.upkeep.horizon_held is False
    assert queue.fair_claim.statement().text == cached
    await claim_equals_oracle(queue, database_url, "t", 4)
    assert await queue.verify() == []



@pytest.mark.parametrize("held", [False, True], ids=["index_walk", "sorted_pass"])
async def test_the_walk_keeps_the_group_after_the_probe_in_each_plan(
        queue: Queue, database_url: str, held: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe of one group reads each plan's first two folded groups: the second is the
    bound of the groups left unread. Two groups of one plan with three jobs each, served
    the same: a claim of 2 takes each group's first job (the second job of a group comes
    after the other group's first), and a claim of 3 then 4 follow the oracle."""
    monkeypatch.setattr(FairClaim, "probe_floor", (1, 1))
    pin_walk(queue, monkeypatch, horizon_held=False)
    for g in ("a", "b"):
        await queue.upsert_group(g, plan="pro")
    ids = {g: [(await queue.enqueue("t", {"n": n}, group_id=g)).id for n in range(3)]
           for g in ("a", "b")}
    await queue.upkeep.run_once()
    pin_walk(queue, monkeypatch, horizon_held=held)
    assert ("sorted_plans AS (" in queue.fair_claim.statement().text) is held
    await claim_equals_oracle(queue, database_url, "t", 2)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        got = [j.id for j in await queue.claim("t", 2, conn=conn)]
        await conn.rollback()
    assert got == [ids["a"][0], ids["b"][0]]
    for limit in (3, 4):
        await claim_equals_oracle(queue, database_url, "t", limit)
