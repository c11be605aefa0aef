"""The fair order (docs/design.md, "The fair claim"), scenario by scenario."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from rota import Queue

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")


@pytest.fixture(params=["group", "owner"])
async def queue(make_queue: Any, request: pytest.FixtureRequest) -> Queue:
    """Each scenario under both orders: its groups have no owner, so each is its own,
    and fair_by="owner" gives the same order (docs/design.md, "The fair claim")."""
    q: Queue = await make_queue(fair_by=request.param)
    return q


async def enqueue(queue: Queue, group: str | None, n: int, type_: str = "t") -> list[int]:
    ids = []
    for i in range(n):
        job = await queue.enqueue(type_, {"g": group, "i": i}, group_id=group)
        assert job
        ids.append(job.id)
    return ids


async def test_plan_priority_first_and_ownerless_ranks_as_middle(queue: Queue) -> None:
    for gid, plan in (("free-1", "free"), ("std-1", "standard"), ("pro-1", "pro"),
                      ("no-owner", None)):
        await queue.upsert_group(gid, plan=plan)
    free = await enqueue(queue, "free-1", 1)
    nogroup = await enqueue(queue, None, 1)
    std = await enqueue(queue, "std-1", 1)
    noowner = await enqueue(queue, "no-owner", 1)
    pro = await enqueue(queue, "pro-1", 1)
    got = [j.id for j in await queue.claim("t", 5)]
    # pro (2); then the middle priority (1): std, no group and no owner by served+position
    # (all 0) then age; then free (0).
    assert got == pro + nogroup + std + noowner + free


async def test_least_served_group_first_counting_running_as_served(queue: Queue) -> None:
    await queue.upsert_group("busy", plan="pro")
    await queue.upsert_group("idle", plan="pro")
    busy = await enqueue(queue, "busy", 3)
    [first] = await queue.claim("t", 1)  # busy's oldest: running now, counts as served
    assert first.id == busy[0]
    idle = await enqueue(queue, "idle", 1)  # newer than busy's waiting jobs
    [nxt] = await queue.claim("t", 1)
    assert nxt.id == idle[0]
    assert await queue.complete(first)
    assert await queue.complete(nxt)
    # served: busy 1 (done), idle 1 (done): tie on served, so age decides.
    [then] = await queue.claim("t", 1)
    assert then.id == busy[1]


async def test_served_counts_only_this_type(queue: Queue) -> None:
    await queue.upsert_group("a", plan="free")
    await queue.upsert_group("b", plan="free")
    other = await enqueue(queue, "a", 3, type_="other")
    for j in await queue.claim("other", 3):
        await queue.complete(j)
    assert len(other) == 3
    a = await enqueue(queue, "a", 1)
    b = await enqueue(queue, "b", 1)
    assert [j.id for j in await queue.claim("t", 2)] == a + b


async def test_oldest_first_as_tie_break(queue: Queue) -> None:
    await queue.upsert_group("x", plan="free")
    ids = await enqueue(queue, "x", 4)
    assert [j.id for j in await queue.claim("t", 4)] == ids


async def test_paused_group_is_skipped_and_resumes_at_next_claim(queue: Queue) -> None:
    await queue.upsert_group("p", plan="pro", active=False)
    await queue.upsert_group("f", plan="free")
    paused = await enqueue(queue, "p", 2)
    free = await enqueue(queue, "f", 1)
    assert [j.id for j in await queue.claim("t", 5)] == free
    await queue.upsert_group("p", plan="pro", active=True)
    assert [j.id for j in await queue.claim("t", 5)] == paused


async def test_plan_upgrade_reorders_at_next_claim(queue: Queue) -> None:
    await queue.upsert_group("early", plan="standard")
    await queue.upsert_group("late", plan="free")
    early = await enqueue(queue, "early", 2)
    late = await enqueue(queue, "late", 2)
    await queue.upsert_group("late", plan="pro")
    got = [j.id for j in await queue.claim("t", 4)]
    assert got == late + early


async def test_batch_of_25_over_5_equal_groups_takes_5_from_each(queue: Queue) -> None:
    for g in range(5):
        await queue.upsert_group(f"g{g}", plan="standard")
    for g in range(5):  # group by group: FIFO alone would take 25 from the first two
        await enqueue(queue, f"g{g}", 12)
    batch = await queue.claim("t", 25)
    assert len(batch) == 25
    assert Counter(j.group_id for j in batch) == {f"g{g}": 5 for g in range(5)}
    # Interleaved: each consecutive run of five has one job from each group.
    for k in range(5):
        assert {j.group_id for j in batch[5 * k: 5 * k + 5]} == {f"g{g}" for g in range(5)}


async def test_group_missing_from_groups_relation_is_never_stranded(
    queue: Queue, aconn: Any
) -> None:
    await queue.upsert_group("gone", plan="free")
    job = await queue.enqueue("t", {}, group_id="gone")
    assert job
    await aconn.execute(f'DELETE FROM "{queue.schema}".groups WHERE group_id = %s', ["gone"])
    [claimed] = await queue.claim("t", 1)  # ranked as an active group with no owner
    assert claimed.id == job.id


async def test_application_relation_drives_plan_and_pause(
    make_queue: Any, aconn: Any, schema: str
) -> None:
    base = await make_queue()
    s = f'"{schema}"'
    await aconn.execute(f"""
        CREATE TABLE {s}.users (id text PRIMARY KEY);
        CREATE TABLE {s}.subscriptions (user_id text PRIMARY KEY, plan text NOT NULL);
        CREATE TABLE {s}.campaigns (id uuid PRIMARY KEY, user_id text, status text);
        CREATE VIEW {s}.campaign_groups AS
          SELECT c.id::text AS group_id, c.user_id AS owner_id,
                 CASE WHEN c.user_id IS NULL THEN NULL
                      ELSE coalesce(sub.plan, 'free') END AS plan,
                 c.status = 'active' AS active
          FROM {s}.campaigns c LEFT JOIN {s}.subscriptions sub ON sub.user_id = c.user_id;
        INSERT INTO {s}.users VALUES ('u1'), ('u2');
        INSERT INTO {s}.subscriptions VALUES ('u2', 'pro');
        INSERT INTO {s}.campaigns VALUES
          ('00000000-0000-0000-0000-000000000001', 'u1', 'active'),
          ('00000000-0000-0000-0000-000000000002', 'u2', 'active');
    """)
    queue = await make_queue(groups=f"{schema}.campaign_groups")
    c1, c2 = "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"
    j1 = await queue.enqueue("t", {}, group_id=c1)
    j2 = await queue.enqueue("t", {}, group_id=c2)
    assert j1 and j2
    # u1 has no subscription: lowest plan; u2 is pro.
    await aconn.execute(f"UPDATE {s}.campaigns SET status = 'paused' WHERE id = %s", [c2])
    assert [j.id for j in await queue.claim("t", 2)] == [j1.id]
    await aconn.execute(f"UPDATE {s}.campaigns SET status = 'active' WHERE id = %s", [c2])
    assert [j.id for j in await queue.claim("t", 2)] == [j2.id]
    assert base is not queue
