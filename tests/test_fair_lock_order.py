"""Lock order between the claim's upkeep and writers (docs/fast-claim.md, "Writers"):
the upkeep never waits for a writer while it holds rows a writer may need next."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

# Mirrors src/rota/fair/upkeep.sql: the fold, then the edge move, in one statement.
UPKEEP = ("SELECT {s}.fair_fold('t', now()), "
          "{s}.fair_advance('t', now() - interval '1 hour')")


async def test_the_upkeep_does_not_wait_for_the_first_completion_of_a_type(
    make_queue: Any, queue_url: str, database_url: str, aconn: Any, schema: str
) -> None:
    """A transaction completes the first job of its type (its writer makes the type's
    fair_edge row) and then enqueues into a group, while the upkeep folds that group
    (fair_fold locks its fair_groups row FOR UPDATE) and then moves the edge. The edge
    move used to insert the missing fair_edge row too, and so waited for the
    transaction's uncommitted insert of it while holding the group's row, which the
    transaction's enqueue (FOR KEY SHARE, fair_jobs_insert) waited for: a deadlock."""
    queue = await make_queue()
    await queue.upsert_group("big", plan="pro", owner_id="A")
    for i in range(3):
        await queue.enqueue("t", {"i": i}, group_id="big")
    # Claims on the caller's connections through a queue whose pool is not open: no
    # upkeep round runs behind the test's back (it would make the edge row).
    idle = Queue(queue_url, schema=schema)
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        assert len(await idle.claim("t", 1, conn=c)) == 1  # a delta for "big", committed
        await c.commit()
    s = sql.Identifier(schema)
    cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {s}.fair_edge").format(s=s))
    assert await cur.fetchone() == (0,)

    async with await psycopg.AsyncConnection.connect(database_url) as writer, \
            await psycopg.AsyncConnection.connect(database_url, autocommit=True) as upkeep:
        await writer.execute("SET deadlock_timeout = '100ms'")
        [job] = await idle.claim("t", 1, conn=writer)
        await idle.complete(job, conn=writer)  # makes the edge row, not yet committed

        async def run_upkeep() -> Any:
            cur = await upkeep.execute(sql.SQL(UPKEEP).format(s=s))
            return await cur.fetchone()

        upkept = asyncio.ensure_future(run_upkeep())
        # Until the upkeep is done, or waits for a lock (the writer's transaction).
        for _ in range(500):
            if upkept.done():
                break
            cur = await aconn.execute(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                [upkeep.info.backend_pid])
            row = await cur.fetchone()
            if row is not None and row[0]:
                break
            await asyncio.sleep(0.01)
        # The writer's enqueue into the group the fold holds (or held).
        await idle.enqueue("t", {"after": True}, group_id="big", conn=writer)
        await writer.commit()
        folded, advanced = await asyncio.wait_for(upkept, 30)
        assert folded == 1 and advanced is False  # the edge row was not the upkeep's
        cur = await aconn.execute(
            sql.SQL("SELECT {s}.fair_advance('t', now() - interval '1 hour')").format(s=s))
        assert await cur.fetchone() == (True,)  # now committed: the next round moves it
