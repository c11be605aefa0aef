"""The walks' floors (src/rota/fair/bookkeeping.sql, fair_walk_floors; docs/fast-claim.md,
"The walk floors"): every fold records, per plan, a lower bound of the key of every row
the claim's index walks read, and the walks start there, past the dead versions of the
rows every fold rewrites, which a long transaction keeps from vacuum. A row a writer puts
below the floor (a new group, a lowered head, a plan change) is special until a fold
takes it in; `rota verify` names a row below its floor; the rebuild forgets the floors."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from rota import Queue

from .helpers import index_entries_returned
from .test_fair_contract import run
from .test_fast_claim import claim_equals_oracle
from .test_fold_mark import current_xid


async def six_groups_served_three_times(queue: Queue,
                                        pin: psycopg.AsyncConnection[Any]) -> None:
    """Groups g1..g6 of plan pro, 20 jobs each (g1's first); while ``pin`` holds the
    horizon with an xid, 9 rounds of claiming 2 and completing them, each folded. Each
    round serves the two groups with the least served and oldest heads, so each fold
    rewrites two rows: after the 9 rounds every group is served 3 times, and the 18
    versions the folds replaced (served 0, 1 and 2) stay, dead, in the walks' indexes."""
    for g in ("g1", "g2", "g3", "g4", "g5", "g6"):
        await queue.upsert_group(g, plan="pro")
        await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": g}] * 20)
    await queue.upkeep.run_once()  # the changes the enqueues recorded, taken in
    await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    await current_xid(pin)
    for _ in range(9):
        await queue.complete_many(await queue.claim("t", 2))
        await queue.upkeep.run_once()


async def entries_read(queue: Queue, database_url: str, index: str,
                       floors: bool = True) -> int:
    """The entries of ``index`` a claim of 2 returns, in a transaction rolled back
    afterwards (seq scans off, as at any size past a few pages); without the floors
    (deleted in that transaction) when ``floors`` is false."""
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        await c.execute("SET LOCAL enable_seqscan = off")
        if not floors:
            await c.execute(f"DELETE FROM {queue.schema}.fair_walk_floor")
        assert len(await queue.claim("t", 2, conn=c)) == 2
        n = await index_entries_returned(c, f"{queue.schema}.{index}")
        await c.rollback()
    return n


async def range_entries(queue: Queue, database_url: str, index: str, table: str,
                        where: str, order: str) -> int:
    """The entries of ``index`` a full read of its range ``where`` (on ``table``, in the
    index's ``order``) returns: every version's, live or dead."""
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            await c.execute(f"SET LOCAL {setting} = off")
        await c.execute(f"SELECT count(*) FROM (SELECT 1 FROM {queue.schema}.{table}"
                        f" WHERE {where} ORDER BY {order}) x")
        n = await index_entries_returned(c, f"{queue.schema}.{index}")
        await c.rollback()
    return n


async def test_the_group_walk_reads_no_dead_version_below_its_floor(
        make_queue: Any, database_url: str, aconn: Any) -> None:
    """The walk of plan pro returns its 6 live entries, and none of the 18 dead ones
    below the floor (served 3, g1's head); without the floor it returns all 24."""
    queue: Queue = await make_queue()
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    async with await psycopg.AsyncConnection.connect(database_url) as pin:
        await six_groups_served_three_times(queue, pin)
        rows = await run(aconn, queue, "SELECT plan_key, served_n::int FROM {s}.fair_walk_floor"
                         " WHERE level = 'group'")
        assert rows == [("p:pro", 3)]
        assert await entries_read(queue, database_url, "fair_groups_walk_idx") == 6
        assert await range_entries(
            queue, database_url, "fair_groups_walk_idx", "fair_groups",
            "type = 't' AND plan = 'pro' AND active AND head_lb < 'infinity'",
            "served_n, head_lb, head_id") == 24
        assert await entries_read(queue, database_url, "fair_groups_walk_idx",
                                  floors=False) == 24
        assert await queue.verify() == []
        await claim_equals_oracle(queue, database_url, "t", 2)
        await pin.rollback()


async def test_the_owner_walks_read_no_dead_version_below_their_floors(
        make_queue: Any, database_url: str, aconn: Any) -> None:
    """By owner, each group its own owner: the owner walk returns the 6 live owners'
    entries and none of the dead versions of their rows below the floor (without the
    floor, every entry of the plan's range); each probed owner's walk of its groups
    starts at its row's bound, past its group's 3 dead versions: 6 entries, one a
    group."""
    queue: Queue = await make_queue(fair_by="owner")
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    async with await psycopg.AsyncConnection.connect(database_url) as pin:
        await six_groups_served_three_times(queue, pin)
        rows = await run(aconn, queue, "SELECT plan_key, served_n::int FROM {s}.fair_walk_floor"
                         " WHERE level = 'owner'")
        assert rows == [("p:pro", 3)]
        assert await entries_read(queue, database_url, "fair_owners_walk_idx") == 6
        every = await range_entries(queue, database_url, "fair_owners_walk_idx",
                                    "fair_owners", "type = 't' AND plan_key = 'p:pro'"
                                    " AND b_head_lb < 'infinity'",
                                    "served_n, b_served, b_head_lb, b_head_id")
        assert every > 6
        assert await entries_read(queue, database_url, "fair_owners_walk_idx",
                                  floors=False) == every
        assert await entries_read(queue, database_url, "fair_groups_unit_walk_idx") == 6
        assert await queue.verify() == []
        await claim_equals_oracle(queue, database_url, "t", 2)
        await pin.rollback()


@pytest.mark.parametrize("fair_by", ["group", "owner"])
async def test_a_row_a_writer_puts_below_the_floor_is_claimed_in_order(
        make_queue: Any, database_url: str, aconn: Any, fair_by: str) -> None:
    """After the floor rose to served 3, a new group (served 0), a group moved into the
    plan from another (served 0 there) and an empty group that gets a job again lie below
    it: each is special until a fold takes it in, and the claim takes them first, as
    the oracle does, before and after that fold."""
    queue: Queue = await make_queue(fair_by=fair_by)
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    async with await psycopg.AsyncConnection.connect(database_url) as pin:
        await six_groups_served_three_times(queue, pin)
        await pin.rollback()
    await queue.upsert_group("other", plan="free")
    await queue.enqueue("t", {}, group_id="other")
    await queue.upkeep.run_once()
    await queue.upsert_group("new", plan="pro")
    await queue.enqueue("t", {}, group_id="new")
    await queue.upsert_group("other", plan="pro")
    assert await queue.verify() == []
    await claim_equals_oracle(queue, database_url, "t", 2)
    claimed = await queue.claim("t", 2)
    assert sorted(j.group_id for j in claimed) == ["new", "other"]
    await queue.complete_many(claimed)
    await queue.upkeep.run_once()
    assert await queue.verify() == []
    await claim_equals_oracle(queue, database_url, "t", 2)


async def test_verify_names_a_row_below_its_floor_and_the_rebuild_clears_it(
        make_queue: Any, database_url: str, aconn: Any) -> None:
    """A floor above a group's row (as a fold that missed a row would leave it) is a
    `floor` violation, the owner level's an `owner_floor` one; the rebuild forgets the
    floors, and the next fold records them again."""
    queue: Queue = await make_queue()
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    async with await psycopg.AsyncConnection.connect(database_url) as pin:
        await six_groups_served_three_times(queue, pin)
        await pin.rollback()
    [(served, head_lb, head_id)] = await run(
        aconn, queue, "SELECT served_n::text, head_lb::text, head_id FROM {s}.fair_groups"
        " WHERE group_id = 'g1'")
    await run(aconn, queue, "UPDATE {s}.fair_walk_floor SET served_n = 4, b_served = 4")
    found = await queue.verify()
    assert len(found) == 12
    g1 = [v for v in found if v.group_id == "g1"]
    assert [(v.invariant, v.found) for v in g1] == [
        ("floor", f"({served}, {head_lb}, {head_id})")]
    assert {v.invariant for v in found} == {"floor", "owner_floor"}
    assert sum(v.group is None for v in found) == 6
    await queue.repair_bookkeeping()
    assert await run(aconn, queue, "SELECT count(*) FROM {s}.fair_walk_floor") == [(0,)]
    await queue.complete_many(await queue.claim("t", 2))
    await queue.upkeep.run_once()
    assert await run(aconn, queue, "SELECT level, served_n::int FROM {s}.fair_walk_floor"
                     " ORDER BY level") == [("group", 3), ("owner", 3)]
    assert await queue.verify() == []
