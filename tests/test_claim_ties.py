"""Equal keys never make the fair claim's probe grow (docs/fast-claim.md, "The claim",
step 4): jobs written by one statement share one created_at, groups share served counts, and a bound
can equal the batch's last key. The claim still gives exactly the oracle's order."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from rota import Queue

from .test_fast_claim import claim_equals_oracle, recount

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")


async def _load(queue: Queue, groups: int, per_group: int,
                plans: tuple[str, ...] = ("free", "standard", "pro")) -> None:
    """``plans`` over ``groups`` groups, then ``per_group`` jobs each in ONE
    enqueue_many: every job shares one created_at, ids interleave the groups."""
    for g in range(groups):
        await queue.upsert_group(f"g{g:04d}", plan=plans[g % len(plans)])
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"g{g:04d}",
                               "max_attempts": 100}
                              for _ in range(per_group) for g in range(groups)])


@pytest.mark.parametrize("settle", ["complete", "defer", "fail", "complete_enqueue"])
async def test_one_statements_jobs_tie_on_created_at_and_the_probe_stays_put(
    make_queue: Any, database_url: str, schema: str, settle: str
) -> None:
    queue: Queue = await make_queue(backoff_base=timedelta(0))
    await _load(queue, groups=120, per_group=6)
    claim = queue.fair_claim
    for round_ in range(12):
        if round_ % 4 == 0:
            await claim_equals_oracle(queue, database_url, "t", 25)
        batch = await queue.claim("t", 25)
        assert len(batch) == 25
        if settle == "defer":
            assert await queue.defer(batch) == 25
        elif settle == "fail":
            for j in batch:
                assert await queue.fail(j, "boom") == "retry"
        else:
            assert all(await queue.complete_many(batch))
            if settle == "complete_enqueue":
                await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": j.group_id}
                                          for j in batch])
        await queue.run_upkeep()
    assert claim.retries.get("t", 0) == 0
    assert claim._probe["t", "group"] == claim._floor(25)
    await claim_equals_oracle(queue, database_url, "t", 25)
    async with queue.pool.connection() as c:
        assert await recount(c, schema) == []


async def test_ties_in_served_counts_and_heads_with_one_claim_per_group(
    make_queue: Any, database_url: str,
) -> None:
    # Every group served once, every head tied: the walk orders by (served, head, id).
    queue: Queue = await make_queue()
    # Rounds of upkeep only where the test runs them: a background round still folding
    # when the last claim reads would leave it heads older than the fold's (a retry of
    # timing, not of ties: seen once under load).
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    await _load(queue, groups=60, per_group=4, plans=("standard",))
    for _ in range(3):
        first = await queue.claim("t", 60)
        assert len({j.group_id for j in first}) == 60
        assert all(await queue.complete_many(first))
        await queue.upkeep.run_once()
    await claim_equals_oracle(queue, database_url, "t", 25)
    await queue.claim("t", 25)
    assert queue.fair_claim.retries.get("t", 0) == 0


async def test_claims_on_the_callers_connection_keep_the_special_set_small(
    make_queue: Any, database_url: str, schema: str,
) -> None:
    # An application that always claims inside its own transaction (conn=): each claim
    # still asks the queue's upkeep for a round, so the unfolded served-count rows (the
    # claim's special groups) stay about one claim's worth instead of growing.
    import psycopg
    from psycopg import sql

    queue: Queue = await make_queue()
    await _load(queue, groups=100, per_group=5, plans=("standard",))
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        for _ in range(30):
            batch = await queue.claim("t", 10, conn=c)
            assert all(await queue.complete_many(batch, conn=c))
            await c.commit()
            await queue.run_upkeep()
        await queue.run_upkeep()
        await queue.upkeep.settle()
        cur = await c.execute(sql.SQL("SELECT count(DISTINCT group_id) FROM {}.fair_served")
                              .format(sql.Identifier(schema)))
        row = await cur.fetchone()
        await c.rollback()
    assert row is not None and row[0] <= 20, row  # 300 jobs of 100 groups claimed in all
