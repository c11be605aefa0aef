"""Fair between customers (docs/design.md, "The fair claim"): the owner level of
``fair_by="owner"``, and plans of one priority that share the claim by weight."""

from __future__ import annotations

from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import InvalidInput, Job, Plan, Plans, Queue
from rota.db import migrate, migrations
from rota.fair.upkeep import UpkeepConfig

from .helpers import index_entries_returned, schema_before
from .test_fast_claim import claim_equals_oracle

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")


async def drain(queue: Queue, batch: int, total: int) -> list[str]:
    """Claim ``batch`` at a time and complete each batch until ``total`` jobs were
    handed out; returns each job's group in claim order."""
    order: list[str] = []
    while len(order) < total:
        jobs = await queue.claim("t", batch)
        assert jobs, f"nothing claimable after {len(order)} jobs"
        order += [j.payload["g"] for j in jobs]
        assert await queue.complete_many(jobs) == [True] * len(jobs)
    return order


async def a_and_b(queue: Queue) -> None:
    """Owner A (pro) has 20 groups of 50 jobs; owner B (pro) one group of 50, enqueued
    after A's."""
    for i in range(20):
        await queue.upsert_group(f"a{i}", plan="pro", owner_id="A")
    await queue.upsert_group("b0", plan="pro", owner_id="B")
    for i in range(20):
        await queue.enqueue_many([{"type": "t", "payload": {"g": f"a{i}"},
                                   "group_id": f"a{i}"} for _ in range(50)])
    await queue.enqueue_many([{"type": "t", "payload": {"g": "b0"}, "group_id": "b0"}
                              for _ in range(50)])


@pytest.mark.parametrize("fair_by, b_last, b_first_100", [
    # By group, B's one group waits behind each round of A's 20: B's 50th job is the
    # last of 1,050, and 4 of the first 100 are B's (as FIFO would hand them out).
    ("group", 1050, 4),
    # By owner, A and B alternate while both have work: B's last job is the 100th.
    ("owner", 100, 50),
])
async def test_an_owner_splitting_its_work_over_groups_takes_no_more_than_its_share(
        make_queue: Any, fair_by: str, b_last: int, b_first_100: int) -> None:
    queue = await make_queue(fair_by=fair_by)
    await a_and_b(queue)
    order = await drain(queue, 10, 1050)
    b = [i + 1 for i, g in enumerate(order) if g == "b0"]
    assert len(order) == 1050 and len(b) == 50
    assert b[-1] == b_last
    assert sum(1 for g in order[:100] if g == "b0") == b_first_100


SHARING = Plans([Plan("free", "Free", 1, weight=1), Plan("pro", "Pro", 1, weight=4)])


@pytest.mark.parametrize("fair_by", ["group", "owner"])
async def test_plans_of_one_priority_share_by_weight_and_free_is_never_starved(
        make_queue: Any, fair_by: str) -> None:
    """Pro (weight 4) and Free (weight 1) at one priority, one owner each, 1,000 jobs
    each: of the first 500 claimed in claims of 10, Pro gets 400, and every claim holds
    Free's share of 2."""
    queue = await make_queue(plans=SHARING, fair_by=fair_by)
    await queue.upsert_group("p", plan="pro", owner_id="P")
    await queue.upsert_group("f", plan="free", owner_id="F")
    for g in ("p", "f"):
        await queue.enqueue_many([{"type": "t", "payload": {"g": g}, "group_id": g}
                                  for _ in range(1000)])
    order = await drain(queue, 10, 500)
    assert Counter(order) == {"p": 400, "f": 100}
    assert [Counter(order[i:i + 10])["f"] for i in range(0, 500, 10)] == [2] * 50


@pytest.mark.parametrize("plans, levels, claimed", [
    # Pro alone at the top priority: the walk reads Pro's level only.
    (Plans([Plan("free", "Free", 0), Plan("standard", "Standard", 1),
            Plan("pro", "Pro", 2)]), 1, {"pro"}),
    # Pro and Standard share the top priority by weight: both levels are read (their
    # owners interleave by served / weight), Free's is not.
    (Plans([Plan("free", "Free", 0), Plan("standard", "Standard", 2, weight=1),
            Plan("pro", "Pro", 2, weight=4)]), 2, {"pro", "standard"}),
])
async def test_the_owner_walk_reads_no_owner_of_a_priority_it_cannot_reach(
        make_queue: Any, database_url: str, plans: Plans, levels: int,
        claimed: set[str]) -> None:
    """20 owners on each plan, one group of 3 jobs each: a claim of 5 by owner reads, of
    the owners' rows (fair_owners_walk_idx), the first probe_groups + 1 (14) of each
    plan at the top priority, and the first row of the next level, which ends the
    priority's ties: 15 and 29, where it read 14 of each of the three plans' levels
    (42)."""
    queue: Queue = await make_queue(plans=plans, fair_by="owner")
    await _twenty_owners_a_plan(queue)
    # Rebuilt from the jobs: no change or delta left unfolded, so no owner is special
    # and the walk reads the owners' rows alone.
    await queue.repair_bookkeeping()
    jobs, n = await _claim_5_reading(queue, database_url, "fair_owners_walk_idx")
    assert {j.payload["g"] for j in jobs} <= claimed
    assert len({j.group_id for j in jobs}) == 5
    assert n == {1: 15, 2: 29}[levels]


async def test_the_owner_claim_looks_up_no_special_owner_of_a_priority_its_walk_cannot_reach(
        make_queue: Any, database_url: str) -> None:
    """Free (0), Standard (1) and Pro (2), 20 owners each, one group of 3 jobs each;
    claims left unfolded make 5 Free, 5 Standard and 3 Pro owners special. A claim of 5
    by owner walks Pro's level (17 owners, more than probe_groups + 1 = 14), so no Free
    or Standard owner can be probed or bound the rest: of the special owners' rows
    (fair_owners_pkey) it looks up Pro's 3 alone, where it looked up all 13."""
    levels = Plans([Plan("free", "Free", 0), Plan("standard", "Standard", 1),
                    Plan("pro", "Pro", 2)])
    queue: Queue = await make_queue(plans=levels, fair_by="owner")
    await _twenty_owners_a_plan(queue)
    await queue.repair_bookkeeping()
    # Claims by queues that rank one plan first, never folded: their groups' deltas make
    # their owners special.
    made = {"free": 5, "standard": 5, "pro": 3}
    for first, n in made.items():
        ranks = Plans([Plan(p, p, 0) for p in made if p != first] + [Plan(first, first, 2)])
        other: Queue = await make_queue(plans=ranks)
        other.upkeep.request = other.upkeep._seen.add  # type: ignore[method-assign]
        taken = await other.claim("t", n)
        assert {j.payload["g"] for j in taken} == {first} and len(taken) == n
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    jobs, n = await _claim_5_reading(queue, database_url, "fair_owners_pkey")
    assert {j.payload["g"] for j in jobs} == {"pro"}
    assert len({j.group_id for j in jobs}) == 5
    assert n == 3


async def _twenty_owners_a_plan(queue: Queue) -> None:
    """20 owners on each of the plans free, standard and pro, one group of 3 jobs each
    (groups ``{plan}{i}``, owners ``{plan}-{i}``)."""
    for plan in ("free", "standard", "pro"):
        for i in range(20):
            await queue.upsert_group(f"{plan}{i}", plan=plan, owner_id=f"{plan}-{i}")
            await queue.enqueue_many([{"type": "t", "payload": {"g": plan},
                                       "group_id": f"{plan}{i}"}] * 3)


async def _claim_5_reading(queue: Queue, database_url: str,
                           index: str) -> tuple[list[Job], int]:
    """A claim of 5 by owner from the smallest probe (limit + 8 owners), on a
    connection of its own: the jobs, and the index tuples of ``index`` its one statement
    read."""
    fair = queue.fair_claim
    assert fair._start(("t", "owner"), 5)[0] == 13  # the floor: limit + 8
    retries = fair.retries.get("t", 0)
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        jobs = await queue.claim("t", 5, conn=c)
        n = await index_entries_returned(c, f"{queue.schema}.{index}")
        await c.commit()
    assert fair.retries.get("t", 0) == retries  # one statement: its reads alone
    return jobs, n


async def test_weights_change_at_the_next_claim(make_queue: Any) -> None:
    """A queue opened with new weights on the same rows shares by them at its next claim
    (nothing queued is rewritten)."""
    even = Plans([Plan("free", "Free", 1), Plan("pro", "Pro", 1)])
    queue = await make_queue(plans=even)
    await queue.upsert_group("p", plan="pro")
    await queue.upsert_group("f", plan="free")
    for g in ("p", "f"):
        await queue.enqueue_many([{"type": "t", "payload": {"g": g}, "group_id": g}
                                  for _ in range(100)])
    assert Counter(await drain(queue, 10, 20)) == {"p": 10, "f": 10}
    weighted = await make_queue(plans=SHARING)
    # Served 10 each: Pro's virtual time 10/4 against Free's 10, so Pro takes the next
    # 30 alone (reaching 40/4 = 10), then they share 4:1.
    assert Counter(await drain(weighted, 10, 40)) == {"p": 38, "f": 2}


async def test_a_group_moved_to_another_owner_counts_for_it_at_the_next_claim(
        make_queue: Any) -> None:
    queue = await make_queue(fair_by="owner")
    for gid, owner in (("x1", "X"), ("x2", "X"), ("y1", "Y")):
        await queue.upsert_group(gid, plan="pro", owner_id=owner)
        await queue.enqueue_many([{"type": "t", "payload": {"g": gid}, "group_id": gid}
                                  for _ in range(10)])
    # X (two groups) and Y alternate: X's jobs take turns between x1 and x2.
    assert await drain(queue, 4, 4) == ["x1", "y1", "x2", "y1"]
    await queue.run_upkeep()  # the owners' rows have the served counts: the move is a change
    # x2 moves to Y: X is x1 (served 1), Y is y1 and x2 (served 3). X takes its
    # positions 1 and 2 alone; at 3 Y's first job (x2's: served 1 before y1's 2) wins the
    # tie on the group's served count; then X's fourth.
    await queue.upsert_group("x2", plan="pro", owner_id="Y")
    assert await drain(queue, 4, 4) == ["x1", "x1", "x2", "x1"]


async def test_a_group_without_an_owner_is_its_own_owner(make_queue: Any) -> None:
    """Ownerless groups compete as owners of their own beside owned ones: two ownerless
    groups and an owner with two groups get a third each."""
    queue = await make_queue(fair_by="owner")
    for gid, owner in (("n1", None), ("n2", None), ("o1", "O"), ("o2", "O")):
        await queue.upsert_group(gid, plan="pro", owner_id=owner)
        await queue.enqueue_many([{"type": "t", "payload": {"g": gid}, "group_id": gid}
                                  for _ in range(10)])
    assert Counter(await drain(queue, 6, 6)) == {"n1": 2, "n2": 2, "o1": 1, "o2": 1}


async def test_bad_owner_and_fair_by_settings_are_refused(make_queue: Any,
                                                          database_url: str) -> None:
    with pytest.raises(InvalidInput, match="^fair_by must be one of 'group', 'owner', "
                                           "got 'customer'$"):
        Queue(database_url, fair_by="customer")
    queue = await make_queue(fair_by="owner")
    with pytest.raises(InvalidInput, match="^owner_id must be a non-empty string, got 7$"):
        await queue.upsert_group("g", plan="pro", owner_id=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="^owner_id is 513 bytes long in UTF-8 \\(513 "
                                           "characters\\); at most 512 bytes are allowed$"):
        await queue.upsert_group("g", plan="pro", owner_id="x" * 513)
    async with queue.connection() as conn:
        cur = await conn.execute(f"SELECT count(*) FROM {queue.schema}.groups")
        assert await cur.fetchone() == (0,)  # nothing half-written


async def test_an_owner_with_a_group_changed_since_the_fold_counts_it(make_queue: Any) -> None:
    """Owner A's row (folded) says served 1; a claim since then made its group a2
    special (served 2 in all). The claim counts A's row plus a2's change: B (served 1)
    goes next, where A's folded row alone would tie with B and A's older job would win."""
    queue = await make_queue(fair_by="owner")
    queue.upkeep.config = UpkeepConfig(every=3600)  # folds only when this test says
    for gid, owner in (("a1", "A"), ("a2", "A"), ("b1", "B")):
        await queue.upsert_group(gid, plan="pro", owner_id=owner)
    for gid in ("a1", "a1", "a2", "a2", "b1", "b1"):
        await queue.enqueue("t", {"g": gid}, group_id=gid)
    assert await drain(queue, 2, 2) == ["a1", "b1"]
    await queue.run_upkeep()  # folded: A served 1, B served 1
    assert await drain(queue, 1, 1) == ["a2"]  # A's a2 (group served 0) before B's b1
    assert await drain(queue, 1, 1) == ["b1"]  # A served 2 now, B 1
    assert await drain(queue, 2, 2) == ["a1", "a2"]


async def test_an_upgrade_builds_the_owners_rows_from_the_groups(
        database_url: str, schema: str) -> None:
    """A schema one migration behind, with owners of several groups, served counts
    folded and not, and pending jobs: the upgrade copies each group's owner and builds
    the owners' rows, so rota verify finds nothing and the claim by owner is the
    naive query's."""
    ident = sql.Identifier(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        schema_before(conn, schema, 14)
        for g, owner in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("solo", None)):
            conn.execute(sql.SQL("INSERT INTO {}.groups (group_id, owner_id, plan)"
                                 " VALUES (%s, %s, 'pro')").format(ident), [g, owner])
            conn.execute(sql.SQL("INSERT INTO {}.jobs (type, group_id, payload, max_attempts,"
                                 " run_after, created_at) SELECT 't', %s, '{{}}', 3, now(),"
                                 " now() FROM generate_series(1, 3)").format(ident), [g])
        # One job of each of a1 and b1 running, folded; one of a2 running, not folded.
        conn.execute(sql.SQL("UPDATE {}.jobs SET status = 'running', locked_at = now(),"
                             " attempts = 1 WHERE id IN (SELECT min(id) FROM {}.jobs"
                             " WHERE group_id IN ('a1', 'b1') GROUP BY group_id)")
                     .format(ident, ident))
        conn.execute(sql.SQL("SELECT {}.fair_fold('t', now())").format(ident))
        conn.execute(sql.SQL("UPDATE {}.jobs SET status = 'running', locked_at = now(),"
                             " attempts = 1 WHERE id = (SELECT min(id) FROM {}.jobs"
                             " WHERE group_id = 'a2')").format(ident, ident))
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        assert await migrate(c, schema) == [m.version for m in migrations()
                                            if m.version >= 14]
    with psycopg.connect(database_url, autocommit=True) as conn:
        owners = conn.execute(sql.SQL(
            "SELECT unit, plan, served_n FROM {}.fair_owners ORDER BY unit")
            .format(ident)).fetchall()
    assert owners == [("g:solo", "pro", 0), ("o:A", "pro", 1), ("o:B", "pro", 1)]
    async with Queue(database_url, schema=schema, fair_by="owner") as queue:
        assert await queue.verify() == []
        await claim_equals_oracle(queue, database_url, "t", 5)
        await queue.upkeep.run_once()
        assert await queue.verify() == []
        await claim_equals_oracle(queue, database_url, "t", 5)
