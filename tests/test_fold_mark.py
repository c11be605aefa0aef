"""The fold mark (src/rota/fair/bookkeeping.sql, fair_fold; docs/fast-claim.md, "The
upkeep"): served-count deltas are append-only rows stamped with their writer's xid, each
fold records a mark (upto, and the xids it leaves open) that covers every delta it folded,
and the claim reads only the rows it does not cover. A delta the fold had to leave stays
open; a long transaction, read-only or one that wrote, does not hold the mark back, and
the claim does not read the deltas folded since it began; `rota verify` names a delta
the mark covers and the rebuild clears it; an upgrade keeps the deltas that were there."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Queue
from rota.db import migrate, migrations
from rota.fair import Violation

from .helpers import index_entries_returned, schema_before
from .test_fair_contract import run
from .test_fast_claim import claim_equals_oracle


@pytest.fixture
def queue(queue: Queue) -> Queue:
    """The queue with its upkeep run only by the test (run_once): a claim notes its type
    for the next round instead of starting the background loop, so the deltas are still
    there to read when the test looks."""
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    return queue


async def mark(aconn: Any, queue: Queue, job_type: str = "t") -> int:
    """The type's newest fold mark (0: none), as an integer."""
    rows = await run(aconn, queue, "SELECT coalesce(max(upto), '0')::text::bigint"
                     " FROM {s}.fair_fold_mark WHERE type = %s", job_type)
    return int(rows[0][0])


async def mark_open(aconn: Any, queue: Queue, job_type: str = "t") -> list[int]:
    """The xids the type's newest fold mark leaves open (none: no mark)."""
    rows = await run(aconn, queue, "SELECT m.open::text[]::bigint[] FROM {s}.fair_fold_mark m"
                     " WHERE m.type = %s ORDER BY m.upto DESC LIMIT 1", job_type)
    return sorted(rows[0][0]) if rows else []


async def current_xid(conn: psycopg.AsyncConnection[Any]) -> int:
    """The xid of ``conn``'s transaction (taking one if it has none): it stays open."""
    cur = await conn.execute("SELECT pg_current_xact_id()::text::bigint")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def deltas(aconn: Any, queue: Queue) -> list[tuple[str, int, int]]:
    """The live deltas: (group, n, xid), by xid and group."""
    return [(g, n, int(x)) for g, n, x in await run(
        aconn, queue, "SELECT group_id, n, xid::text::bigint FROM {s}.fair_served"
        " ORDER BY xid, group_id")]


async def fold_past(queue: Queue, aconn: Any, xid: int) -> None:
    """Fold until the mark passes ``xid``. A mark is at most the oldest xid then running
    in the whole cluster (other tests' transactions too), so a fold may have to wait for
    theirs to end; each try inserts a running job of group gx and deletes it (deltas
    +1 and -1: there is something to fold, and no served count changes)."""
    await queue.upsert_group("gx", plan="pro")
    for _ in range(100):
        if await mark(aconn, queue) > xid:
            return
        await run(aconn, queue, "INSERT INTO {s}.jobs (type, group_id, payload, status,"
                  " max_attempts, run_after, created_at, locked_at, attempts)"
                  " VALUES ('t', 'gx', '{{}}', 'running', 3, now(), now(), now(), 1)")
        await run(aconn, queue, "DELETE FROM {s}.jobs WHERE group_id = 'gx'")
        await queue.upkeep.run_once()
        await asyncio.sleep(0.02)
    raise AssertionError(f"the mark stayed at {await mark(aconn, queue)}, not past {xid}")


async def served(aconn: Any, queue: Queue) -> list[tuple[str, int]]:
    """fair_groups' folded served counts of g1, g2 and g3."""
    return [(g, n) for g, n in await run(
        aconn, queue, "SELECT group_id, served_n FROM {s}.fair_groups"
        " WHERE group_id IN ('g1', 'g2', 'g3') ORDER BY group_id")]


async def groups_of_three(queue: Queue) -> None:
    for g in ("g1", "g2", "g3"):
        await queue.upsert_group(g, plan="pro")
        for _ in range(3):
            await queue.enqueue("t", {}, group_id=g)


async def test_a_fold_marks_above_every_delta_it_folded(queue: Queue, aconn: Any,
                                                        database_url: str) -> None:
    await groups_of_three(queue)
    claimed = await queue.claim("t", 3)
    assert sorted(j.group_id for j in claimed) == ["g1", "g2", "g3"]
    live = await deltas(aconn, queue)
    assert [(g, n) for g, n, _ in live] == [("g1", 1), ("g2", 1), ("g3", 1)]
    claim_xid = live[0][2]
    assert await mark(aconn, queue) == 0
    await queue.upkeep.run_once()
    assert await deltas(aconn, queue) == []
    assert 0 < await mark(aconn, queue)
    await fold_past(queue, aconn, claim_xid)
    # One mark row per type: each fold deletes the ones below its own.
    await queue.complete_many(claimed)
    for j in await queue.claim("t", 2):
        await queue.complete(j)
    await queue.upkeep.run_once()
    assert await run(aconn, queue, "SELECT count(*) FROM {s}.fair_fold_mark") == [(1,)]
    assert await served(aconn, queue) == [("g1", 2), ("g2", 2), ("g3", 1)]
    assert await queue.verify() == []
    await claim_equals_oracle(queue, database_url, "t", 4)


async def test_a_delta_the_fold_left_moves_under_its_own_xid_which_stays_open(
        queue: Queue, aconn: Any, database_url: str) -> None:
    await groups_of_three(queue)
    await queue.claim("t", 3)
    (_, _, x1), (_, _, x2), (_, _, x3) = await deltas(aconn, queue)
    assert x1 == x2 == x3
    # A writer holds g1's row (an enqueue's FOR KEY SHARE, open): the fold skips g1.
    async with await psycopg.AsyncConnection.connect(database_url) as writer:
        await writer.execute(sql.SQL("SELECT 1 FROM {}.fair_groups WHERE group_id = 'g1'"
                                     " FOR KEY SHARE").format(sql.Identifier(queue.schema)))
        await queue.upkeep.run_once()
        # The mark passes x1 (the claim's transaction had ended); g1's delta, left, is
        # now the fold's, whose xid the mark does not cover (open, or at or above upto:
        # which, depends on what else ended meanwhile in the cluster).
        [(g, n, x)] = await deltas(aconn, queue)
        assert (g, n) == ("g1", 1) and x > x1
        assert await mark(aconn, queue) > x1
        assert x >= await mark(aconn, queue) or x in await mark_open(aconn, queue)
        assert x1 not in await mark_open(aconn, queue)
        assert await queue.verify() == []
        await claim_equals_oracle(queue, database_url, "t", 3)
        await writer.rollback()
    # The next fold reads the open delta and folds it.
    await queue.upkeep.run_once()
    assert await deltas(aconn, queue) == []
    assert await served(aconn, queue) == [("g1", 1), ("g2", 1), ("g3", 1)]
    assert await queue.verify() == []


async def test_a_read_only_long_transaction_does_not_hold_the_mark_back(
        queue: Queue, aconn: Any, database_url: str) -> None:
    await groups_of_three(queue)
    async with await psycopg.AsyncConnection.connect(database_url) as reader, \
            await psycopg.AsyncConnection.connect(database_url) as writer:
        await reader.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await reader.execute(sql.SQL("SELECT count(*) FROM {}.jobs")
                             .format(sql.Identifier(queue.schema)))  # the horizon pinned
        for _ in range(3):
            for j in await queue.claim("t", 1):
                await queue.complete(j)
            last = (await deltas(aconn, queue))[-1][2]
            await fold_past(queue, aconn, last)
            assert await deltas(aconn, queue) == []
        # A transaction that wrote (holds an xid) and stays open does not either: the
        # marks that follow pass its xid and leave it open, and the claim still counts
        # every delta written after it.
        open_xid = await current_xid(writer)
        for _ in range(2):
            for j in await queue.claim("t", 1):
                await queue.complete(j)
            await queue.upkeep.run_once()
            assert await mark(aconn, queue) > open_xid
            assert open_xid in await mark_open(aconn, queue)
            assert await deltas(aconn, queue) == []
            assert await queue.verify() == []
        await writer.rollback()
        await reader.rollback()
    await claim_equals_oracle(queue, database_url, "t", 4)


async def test_verify_names_a_delta_below_the_mark_and_the_rebuild_clears_it(
        queue: Queue, aconn: Any) -> None:
    await groups_of_three(queue)
    for j in await queue.claim("t", 3):
        await queue.complete(j)
    await queue.upkeep.run_once()
    m = await mark(aconn, queue)
    assert m > 0
    # A delta the claim cannot see: below the mark (as if a fold had marked too high).
    await run(aconn, queue, "INSERT INTO {s}.fair_served (type, group_id, n, xid)"
              " VALUES ('t', 'g2', 5, '3')")
    assert await queue.verify() == [
        Violation("t", "g2", "mark", f"deltas at or above mark {m}", "1 below it, from xid 3")]
    report = await queue.repair_bookkeeping()
    assert report.found == [
        Violation("t", "g2", "mark", f"deltas at or above mark {m}", "1 below it, from xid 3")]
    assert await queue.verify() == []
    assert await deltas(aconn, queue) == []


async def test_an_upgrade_keeps_the_deltas_of_the_shard_layout(
        database_url: str, schema: str) -> None:
    """A schema at migration 012 (per-session shards updated in place) with unfolded
    deltas: migration 013 stamps them with its own xid, above any mark, so the claim and
    rota verify count them as before."""
    ident = sql.Identifier(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        schema_before(conn, schema, 13)
        for g in ("g1", "g2"):
            conn.execute(sql.SQL("INSERT INTO {}.groups (group_id, plan) VALUES (%s, 'pro')")
                         .format(ident), [g])
            conn.execute(sql.SQL("INSERT INTO {}.jobs (type, group_id, payload, max_attempts,"
                                 " run_after, created_at) VALUES"
                                 " ('t', %s, '{{}}', 3, now(), now()),"
                                 " ('t', %s, '{{}}', 3, now(), now())").format(ident),
                         [g, g])
        conn.execute(sql.SQL("UPDATE {}.jobs SET status = 'running', locked_at = now(),"
                             " attempts = 1 WHERE id IN (SELECT min(id) FROM {}.jobs"
                             " GROUP BY group_id)").format(ident, ident))
        shards = conn.execute(sql.SQL("SELECT group_id, n FROM {}.fair_served ORDER BY 1")
                              .format(ident)).fetchall()
        assert shards == [("g1", 1), ("g2", 1)]
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        assert await migrate(c, schema) == [m.version for m in migrations()
                                            if m.version >= 13]
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(sql.SQL(
            "SELECT group_id, n, xid = (SELECT min(xid) FROM {}.fair_served)"
            " FROM {}.fair_served ORDER BY 1").format(ident, ident)).fetchall()
        assert rows == [("g1", 1, True), ("g2", 1, True)]
    async with Queue(database_url, schema=schema) as queue:
        assert await queue.verify() == []
        await claim_equals_oracle(queue, database_url, "t", 2)
        await queue.upkeep.run_once()
        assert await queue.verify() == []


async def test_the_claim_reads_no_delta_folded_since_an_open_writer_began(
        queue: Queue, aconn: Any, database_url: str) -> None:
    """A transaction that claimed a job (its delta, uncommitted, stamped with its xid)
    stays open while 5 rounds of claims are folded: vacuum can remove none of their
    deltas, and the claim reads none of them: fair_served_xid_idx returns it 1 entry,
    the writer's own row, looked up by its open xid (a mark held at the open xid read
    the writer's row and the 5 rounds'). When the writer commits, its delta counts."""
    for g in ("g1", "g2", "g3", "g4"):
        await queue.upsert_group(g, plan="pro")
        await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": g}] * 4)
    async with await psycopg.AsyncConnection.connect(database_url) as writer:
        [held] = await queue.claim("t", 1, conn=writer)
        open_xid = await current_xid(writer)
        for _ in range(5):
            for j in await queue.claim("t", 1):
                await queue.complete(j)
            await queue.upkeep.run_once()
        assert await deltas(aconn, queue) == []  # every delta but the writer's folded
        assert await mark(aconn, queue) > open_xid
        assert open_xid in await mark_open(aconn, queue)
        async with await psycopg.AsyncConnection.connect(database_url) as c:
            # By index, as at any size past a few pages (this one's is read whole else).
            await c.execute("SET LOCAL enable_seqscan = off")
            claimed = await queue.claim("t", 1, conn=c)
            n = await index_entries_returned(c, f"{queue.schema}.fair_served_xid_idx")
            await c.rollback()
        assert len(claimed) == 1 and n == 1
        await writer.commit()
    # The writer's delta (its claim of a job of held.group_id) counts from its commit on.
    assert [(g, n) for g, n, _ in await deltas(aconn, queue)] == [(held.group_id, 1)]
    assert await queue.verify() == []
    await claim_equals_oracle(queue, database_url, "t", 4)


async def test_a_writer_holding_a_group_open_leaves_one_delta_row_there(
        queue: Queue, aconn: Any, database_url: str) -> None:
    """A transaction that enqueued into g1 and stays open holds g1's fair_groups row (FOR
    KEY SHARE): every fold skips g1. Its deltas from 20 rounds of claims are kept as one
    row, the last fold's, which the mark does not cover, as it does not the writer's,
    where each round's stayed with its own xid (and, past 256 of them, held the mark
    back)."""
    for g in ("g1", "g2"):
        await queue.upsert_group(g, plan="pro")
        await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": g}] * 30)
    async with await psycopg.AsyncConnection.connect(database_url) as writer:
        await queue.enqueue("t", {}, group_id="g1", conn=writer)
        open_xid = await current_xid(writer)
        for _ in range(20):
            jobs = await queue.claim("t", 2)
            assert sorted(j.group_id for j in jobs) == ["g1", "g2"]
            await queue.complete_many(jobs)
            await queue.upkeep.run_once()
        [(g, n, x)] = await deltas(aconn, queue)
        assert (g, n) == ("g1", 20)
        assert x > open_xid
        assert await mark(aconn, queue) > open_xid
        assert open_xid in await mark_open(aconn, queue)
        assert x >= await mark(aconn, queue) or x in await mark_open(aconn, queue)
        assert await served(aconn, queue) == [("g1", 0), ("g2", 20)]
        assert await queue.verify() == []
        await claim_equals_oracle(queue, database_url, "t", 2)
        await writer.commit()
    await queue.upkeep.run_once()
    assert await deltas(aconn, queue) == []
    assert await served(aconn, queue) == [("g1", 20), ("g2", 20)]
    assert await queue.verify() == []
