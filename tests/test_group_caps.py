"""Caps per group (docs/design.md, "Caps"): ``groups.max_running`` keeps one group of
rota's own groups table to N running jobs (every type, fresh locks) across claimers,
work-conserving; a stale lock holds no slot; a queue that claimed before any group was
capped honours a cap set since; bad values write nothing; an application's groups
relation has no group caps."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import ConfigError, InvalidInput, Queue, admin


async def enqueue(queue: Queue, group: str, n: int, type_: str = "a") -> list[int]:
    """Enqueue ``n`` jobs of ``group``; their ids, oldest first."""
    await queue.enqueue_many([{"type": type_, "payload": {}, "group_id": group}
                              for _ in range(n)])
    async with queue.connection() as c:
        cur = await c.execute(sql.SQL("SELECT id FROM {}.jobs WHERE group_id = %s"
                                      " AND type = %s ORDER BY created_at, id").format(
            sql.Identifier(queue.schema)), [group, type_])
        return [r[0] for r in await cur.fetchall()]


async def test_a_group_capped_at_one_gives_its_slot_back_after_the_stale_window(
        make_queue: Any) -> None:
    """G (capped at 1) holds the oldest 10 jobs, H 10 more. A claim of 5 takes G's first
    and H's first 4 (the order alternates G, H; G's later jobs are passed over, work
    goes to H). With G's job running, a claim takes none of G's. Once that job's lock is
    stale (the queue's clock moved past the window), G has its slot again: the next
    claim takes that job again (stale, reclaimable, G's oldest) and H's."""
    queue: Queue = await make_queue(stale_after=timedelta(minutes=5))
    await queue.upsert_group("G", plan=None, max_running=1)
    await queue.upsert_group("H", plan=None)
    g, h = await enqueue(queue, "G", 10), await enqueue(queue, "H", 10)
    assert [j.id for j in await queue.claim("a", 5)] == [g[0], h[0], h[1], h[2], h[3]]
    assert [j.id for j in await queue.claim("a", 5)] == h[4:9]
    queue.clock_offset = timedelta(minutes=5, seconds=1)
    assert [j.id for j in await queue.claim("a", 5)] == [g[0], h[0], h[1], h[2], h[3]]


async def test_a_groups_cap_counts_its_running_jobs_of_every_type(make_queue: Any) -> None:
    queue: Queue = await make_queue()
    await queue.upsert_group("G", plan=None, max_running=2)
    b = await enqueue(queue, "G", 1, "b")
    a = await enqueue(queue, "G", 3, "a")
    assert [j.id for j in await queue.claim("b", 5)] == b
    assert [j.id for j in await queue.claim("a", 5)] == a[:1]
    assert await queue.claim("a", 5) == []


async def test_a_cap_set_by_another_queue_object_is_honoured_by_a_queue_that_claimed_uncapped(
        make_queue: Any) -> None:
    """The first queue claims while no group is capped (the uncapped statement); another
    Queue object then caps G at 1: the first queue's next claim sees it (the uncapped
    statement's guard: retry "caps", then the capped statement, from then on)."""
    first: Queue = await make_queue()
    await first.upsert_group("G", plan=None)
    await first.upsert_group("H", plan=None)
    g, h = await enqueue(first, "G", 10), await enqueue(first, "H", 10)
    assert [j.id for j in await first.claim("a", 2)] == [g[0], h[0]]
    assert first.fair_claim.group_capped is False
    other: Queue = await make_queue()
    await other.upsert_group("G", plan=None, max_running=1)
    # Uncapped, the claim would be G's 2nd, H's 2nd, G's 3rd, H's 3rd.
    assert [j.id for j in await first.claim("a", 4)] == h[1:5]
    assert first.fair_claim.group_capped is True
    # The cap cleared: the capped statement stays for its minute, and takes G's jobs
    # again.
    await other.upsert_group("G", plan=None, max_running=None)
    assert [j.id for j in await first.claim("a", 2)] == [g[1], g[2]]
    assert first.fair_claim.group_capped is True
    # Past the minute the queue asks again: no group is capped, so the uncapped
    # statement claims (G's next two: G has 3 running to H's 5), and stays.
    first.fair_claim.group_cap_recheck = 0.0
    retries = first.fair_claim.retries.get("a", 0)
    assert [j.id for j in await first.claim("a", 2)] == [g[3], g[4]]
    assert first.fair_claim.group_capped is False
    assert first.fair_claim.retries.get("a", 0) == retries
    # Capped again (H at its 5 running): the guard sends the uncapped statement back to
    # the capped one, which passes over H (uncapped, the 2nd job would be H's).
    await other.upsert_group("H", plan=None, max_running=5)
    first.fair_claim.group_cap_recheck = 60.0
    assert [j.id for j in await first.claim("a", 2)] == [g[5], g[6]]
    assert first.fair_claim.group_capped is True


@pytest.mark.parametrize("fair_by", ["group", "owner"])
async def test_eight_concurrent_claims_never_pass_a_group_cap_of_two(
        make_queue: Any, database_url: str, schema: str, fair_by: str) -> None:
    """G (capped at 2, on the top plan: every claim wants its jobs first) and 10 other
    groups with plenty of work, of two types; 8 claims of 3 at once, each on its own
    connection, half of type a and half of type b (so they see different jobs of G: only
    the lock of G, fair_cap_lock, keeps them from each counting the same free slot),
    five rounds with G's running jobs completed between them: after each round exactly
    2 of G's jobs run, and every claim took 3 jobs (work-conserving)."""
    queue: Queue = await make_queue(fair_by=fair_by)
    await queue.upsert_group("G", plan="pro", owner_id="og", max_running=2)
    for type_ in ("a", "b"):
        await enqueue(queue, "G", 40, type_)
        for i in range(10):
            await queue.upsert_group(f"o{i}", plan="free", owner_id=f"o{i}")
            await enqueue(queue, f"o{i}", 20, type_)
    conns = [await psycopg.AsyncConnection.connect(database_url, autocommit=True)
             for _ in range(8)]
    try:
        for _ in range(5):
            batches = await asyncio.gather(*(queue.claim("ab"[i % 2], 3, conn=c)
                                             for i, c in enumerate(conns)))
            assert [len(b) for b in batches] == [3] * 8
            async with await psycopg.AsyncConnection.connect(database_url) as check:
                cur = await check.execute(sql.SQL(
                    "SELECT count(*) FROM {}.jobs WHERE group_id = 'G'"
                    " AND status = 'running'").format(sql.Identifier(schema)))
                assert await cur.fetchone() == (2,)
            for b in batches:
                for j in b:
                    if j.group_id == "G":
                        await queue.complete(j)
    finally:
        for c in conns:
            await c.close()


@pytest.mark.parametrize("value", [0, -1, True, "2", 2.5, 2**31])
async def test_a_bad_max_running_is_invalid_input_and_writes_nothing(
        queue: Queue, value: Any) -> None:
    await queue.upsert_group("g", plan="free", max_running=2)
    with pytest.raises(InvalidInput, match=r"^max_running must be None or an int from 1 to "
                       r"2,147,483,647, got "):
        await queue.upsert_group("g", plan="pro", max_running=value)
    with pytest.raises(InvalidInput, match=r"^max_running must be None or an int from 1 to "
                       r"2,147,483,647, got "):
        await queue.upsert_group("new", plan="pro", max_running=value)
    groups = await admin.list_groups(queue)
    assert [(r.group_id, r.plan, r.max_running) for r in groups] == [("g", "free", 2)]


async def test_an_application_groups_relation_has_no_group_caps(
        make_queue: Any, schema: str) -> None:
    """A view over a table with a max_running column: the claim does not read it (no
    group caps on an application's relation), and upsert_group refuses as before."""
    setup: Queue = await make_queue()
    async with setup.connection() as c:
        await c.execute(sql.SQL(
            "CREATE TABLE {s}.app_g (group_id text, owner_id text, plan text,"
            " active boolean, max_running int);"
            " INSERT INTO {s}.app_g VALUES ('G', NULL, NULL, true, 1);"
            " CREATE VIEW {s}.app_groups AS SELECT * FROM {s}.app_g").format(
                s=sql.Identifier(schema)))
    queue: Queue = await make_queue(groups=f"{schema}.app_groups")
    g = await enqueue(queue, "G", 3)
    assert [j.id for j in await queue.claim("a", 3)] == g
    assert [r.max_running for r in await admin.list_groups(queue)] == [None]
    with pytest.raises(ConfigError):
        await queue.upsert_group("G", plan=None, max_running=1)


@pytest.mark.parametrize("value", [None, "60", -1, float("nan"), float("inf"), True])
async def test_a_bad_group_cap_recheck_is_one_clear_error(queue: Queue, value: Any) -> None:
    """The recheck interval is seconds, 0 or more: anything else is refused where it is
    set, and the interval stays as it was (a claim never meets it)."""
    with pytest.raises(InvalidInput, match=r"^group_cap_recheck must be a number of "
                                           r"seconds, 0 or more, got "):
        queue.fair_claim.group_cap_recheck = value
    assert queue.fair_claim.group_cap_recheck == 60.0
