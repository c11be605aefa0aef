"""While a long transaction holds the xmin horizon (docs/operations.md, "Long
transactions"): the upkeep's loop notices it, the claim stays the oracle's, and once the
transaction ends the claim walks the index as before and the upkeep vacuums what it
kept at once."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota.fair import FairClaim, UpkeepConfig

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


async def test_the_upkeep_sees_the_horizon_held_and_the_claim_stays_exact(
        queue: Queue, database_url: str) -> None:
    """While a long transaction holds the horizon the upkeep says so (horizon_held) and
    the claim, its statement unchanged (each plan's walk from its floor), stays the
    oracle's; once the transaction ends the upkeep says it moves again."""
    queue.upkeep.config = UpkeepConfig(horizon_every=1e-6, held_after=1.0)
    for g, plan in (("a", "pro"), ("b", "pro"), ("c", "free"), ("d", None)):
        await queue.upsert_group(g, plan=plan)
        for _ in range(3):
            await queue.enqueue("t", {}, group_id=g)
    assert await horizon_moves(queue)
    walk = queue.fair_claim.statement().text
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}.jobs")
                             .format(sql.Identifier(queue.schema)))
        await asyncio.sleep(1.2)
        assert await look(queue)
        assert queue.fair_claim.statement().text == walk
        for limit in (1, 4, 7):
            await claim_equals_oracle(queue, database_url, "t", limit)
        for j in await queue.claim("t", 5):
            await queue.complete(j)
        await claim_equals_oracle(queue, database_url, "t", 3)
        await holder.rollback()
    assert await horizon_moves(queue)
    assert queue.upkeep.horizon_held is False
    await claim_equals_oracle(queue, database_url, "t", 4)
    assert await queue.verify() == []


async def test_the_walk_keeps_the_group_after_the_probe_in_each_plan(
        queue: Queue, database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe of one group reads each plan's first two folded groups: the second is the
    bound of the groups left unread. Two groups of one plan with three jobs each, served
    the same: a claim of 2 takes each group's first job (the second job of a group comes
    after the other group's first), and a claim of 3 then 4 follow the oracle."""
    monkeypatch.setattr(FairClaim, "probe_floor", (1, 1))
    for g in ("a", "b"):
        await queue.upsert_group(g, plan="pro")
    ids = {g: [(await queue.enqueue("t", {"n": n}, group_id=g)).id for n in range(3)]
           for g in ("a", "b")}
    await queue.upkeep.run_once()
    await claim_equals_oracle(queue, database_url, "t", 2)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        got = [j.id for j in await queue.claim("t", 2, conn=conn)]
        await conn.rollback()
    assert got == [ids["a"][0], ids["b"][0]]
    for limit in (3, 4):
        await claim_equals_oracle(queue, database_url, "t", limit)


def fair_groups_reads(node: dict[str, Any]) -> set[str]:
    """How a plan reads fair_groups: the index names it walks, "Seq Scan" for a scan."""
    found: set[str] = set()
    if node.get("Relation Name") == "fair_groups":
        found.add(node.get("Index Name") or node["Node Type"])
    for child in node.get("Plans", []):
        found |= fair_groups_reads(child)
    return found


async def generic_plan(queue: Queue, url: str, limit: int) -> Any:
    """The claim's generic plan as a pooled connection runs it (``claim_settings.sql``),
    by EXPLAIN EXECUTE of the prepared statement, in a transaction rolled back. (An
    EXPLAIN with the parameters bound would plan with their values: a custom plan.)"""
    statement = queue.fair_claim.statement()
    groups, per, spread = queue.fair_claim._start(("t", "group"), limit)
    values = statement.params({
        "type": "t", "limit": limit, "run_id": None, "offset": queue.clock_offset,
        "stale_after": queue.stale_after, "served_window": queue.served_window,
        **queue.plans.claim_params(), "probe_groups": groups, "probe_per": per,
        "probe_spread": spread, "candidates": limit * 4 + 16})
    async with await psycopg.AsyncConnection.connect(url) as c:
        await c.execute(queue.store.sql("fair/claim_settings"))
        await psycopg.AsyncRawCursor(c).execute(statement.text, values, prepare=True)
        cur = await c.execute("SELECT parameter_types::text[] FROM pg_prepared_statements "
                              "WHERE NOT from_sql")
        types = (await cur.fetchall())[-1][0]
        await c.rollback()
    async with await psycopg.AsyncConnection.connect(url, prepare_threshold=None) as c:
        await c.execute(sql.SQL("PREPARE claim ({}) AS ").format(
            sql.SQL(", ").join(map(sql.SQL, types)))
            + sql.SQL(statement.text.replace("%", "%%")))
        await c.execute(queue.store.sql("fair/claim_settings"))
        args = sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(t))
                                  for v, t in zip(values, types, strict=True))
        cur = await c.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim ({})")
                              .format(args))
        [[plan]] = await cur.fetchall()
        await c.rollback()
    return plan[0]["Plan"]


async def test_after_the_release_the_claim_walks_the_index_though_the_pin_grew_fair_groups(
        queue: Queue, database_url: str, aconn: psycopg.AsyncConnection[Any]) -> None:
    """Vacuum gives back none of the pages a pin grew fair_groups by while live rows sit
    on them, yet the claim's generic plan still walks fair_groups_walk_idx (a few
    hundred of the grown table's pages), never reading the table whole
    (bench/RESULTS.md, section 19)."""
    n = 2000
    s = sql.Identifier(queue.schema)
    queue.upkeep.config = UpkeepConfig(horizon_every=1e-6, held_after=1.0)
    await aconn.execute(sql.SQL(
        "INSERT INTO {s}.groups (group_id, plan, active) SELECT 'g' || i, "
        "(ARRAY['free', 'pro', 'team'])[i %% 3 + 1], true FROM generate_series(1, %s) i")
        .format(s=s), [n])
    batch = [{"type": "t", "payload": {}, "group_id": f"g{i}"} for i in range(1, n + 1)]

    async def serve_every_group() -> None:
        # Each group served once: the fold then rewrites every group's row.
        await queue.enqueue_many(batch)
        await queue.complete_many(await queue.claim("t", n))
        await queue.upkeep.run_once()

    async def pages() -> int:
        cur = await aconn.execute(sql.SQL("SELECT pg_relation_size(%s::regclass) / 8192"),
                                  [f"{queue.schema}.fair_groups"])
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    await queue.enqueue_many(batch)
    await serve_every_group()
    await aconn.execute(sql.SQL("VACUUM ANALYZE {s}.fair_groups").format(s=s))
    compact = await pages()
    assert await horizon_moves(queue)
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute("SELECT pg_current_xact_id()")  # an xid and a snapshot
        await serve_every_group()
        for _ in range(3):  # every group paused and resumed: each rewrites every row
            for active in (False, True):
                await aconn.execute(sql.SQL("UPDATE {s}.groups SET active = %s")
                                    .format(s=s), [active])
        await asyncio.sleep(1.2)
        assert await look(queue)
        await holder.rollback()
    assert await horizon_moves(queue)
    await queue.upkeep.run_once()  # its VACUUM frees the dead versions, not their pages
    grown = await pages()
    assert grown >= 3 * compact, (compact, grown)  # 4.8x when written
    assert fair_groups_reads(await generic_plan(queue, database_url, 25)) <= {
        "fair_groups_walk_idx", "fair_groups_expiry_idx", "fair_groups_pkey",
        "fair_groups_group_idx"}  # a special group's row by its key, through either
    await claim_equals_oracle(queue, database_url, "t", 25)


async def test_the_round_that_finds_the_horizon_moving_vacuums_at_once(
        queue: Queue, database_url: str, aconn: psycopg.AsyncConnection[Any]) -> None:
    """What the pin kept from vacuum is dead once the horizon moves: the upkeep's round
    that finds it moving vacuums the bookkeeping then, not up to vacuum_every later,
    while the claim walks the index entries the pin left (bench/RESULTS.md, section 25)."""
    queue.upkeep.config = UpkeepConfig(horizon_every=1e-6, held_after=1.0,
                                       vacuum_every=3600.0)
    await queue.upsert_group("a", plan="pro")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "a"}] * 4)

    async def vacuums() -> int:
        await aconn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await aconn.execute(
            "SELECT vacuum_count FROM pg_stat_user_tables"
            " WHERE schemaname = %s AND relname = 'fair_groups'", [queue.schema])
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    assert await horizon_moves(queue)
    before = await vacuums()
    async with await psycopg.AsyncConnection.connect(database_url) as holder:
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute("SELECT pg_current_xact_id()")  # an xid and a snapshot
        await queue.complete_many(await queue.claim("t", 2))
        await asyncio.sleep(1.2)
        assert await look(queue)
        assert await vacuums() == before  # vacuum_every is an hour away
        await holder.rollback()
    assert await horizon_moves(queue)
    for _ in range(50):  # beside the rounds, done within a moment
        if await vacuums() > before:
            break
        await asyncio.sleep(0.1)
    assert await vacuums() == before + 1
    assert await queue.verify() == []
