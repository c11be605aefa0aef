"""The slot a running job holds (jobs.slot_plan and slot_owner; docs/design.md, "Caps";
src/rota/fair/cap_prelude_on.sql): the capped claim finds the owners at their cap from
the running jobs of capped plans alone, each checked against its group as the
statement's snapshot sees it, never from every running job."""

from __future__ import annotations

from typing import Any

import psycopg

from rota import Plan, Plans, Queue

from .test_fair_contract import run

# Free ranks first, so the claim walks Free's owner before Pro's.
PLANS = Plans([Plan("pro", "Pro", 0), Plan("free", "Free", 1, max_running=1)])


async def _setup(make_queue: Any) -> Queue:
    """300 Pro jobs running (Pro has no cap) and 10 pending, over 30 owners; Free's owner
    F1 at its cap of 1 with its group f1's other 2 jobs pending."""
    queue: Queue = await make_queue(plans=PLANS, fair_by="owner")
    queue.upkeep.request = queue.upkeep._seen.add  # type: ignore[method-assign]
    for i in range(30):
        await queue.upsert_group(f"p{i}", plan="pro", owner_id=f"P{i}")
    await queue.upsert_group("f1", plan="free", owner_id="F1")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"p{i % 30}"}
                              for i in range(310)])
    assert len(await queue.claim("t", 300)) == 300
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "f1"}] * 3)
    assert [j.group_id for j in await queue.claim("t", 1)] == ["f1"]
    return queue


async def _claim_counting(database_url: str, queue: Queue,
                          index: str = "jobs_running_group_idx") -> tuple[list[str], int]:
    """A claim of 5 in a transaction of its own on a new connection (a backend's counts
    add up across its transactions until sent), then how many entries of ``index`` it
    read. Returns the claimed jobs' plans and that count."""
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        jobs = await queue.claim("t", 5, conn=c)
        [(read,)] = await run(
            c, queue, "SELECT pg_stat_get_xact_tuples_returned(%s::regclass)",
            f"{queue.schema}.{index}")
        await c.commit()
    return sorted((j.group_id or "")[0] for j in jobs), read


async def test_the_claim_records_the_slot_each_job_of_a_capped_plan_holds(
        make_queue: Any, aconn: Any) -> None:
    queue = await _setup(make_queue)
    rows = await run(aconn, queue, "SELECT slot_plan, slot_owner, count(*) FROM {s}.jobs"
                     " WHERE status = 'running' GROUP BY 1, 2 ORDER BY 1")
    assert rows == [("free", "o:F1", 1), (None, None, 300)]


async def test_the_owners_at_their_cap_are_found_without_reading_every_running_job(
        make_queue: Any, aconn: Any, database_url: str) -> None:
    """F1 is at its cap: the claim leaves it out of its walk and takes Pro's jobs,
    reading none of the 301 running jobs' entries of jobs_running_group_idx (it read
    all of them, looking each one's group up, when it counted every running job)."""
    queue = await _setup(make_queue)
    assert await _claim_counting(database_url, queue) == (["p"] * 5, 0)


async def test_a_slot_whose_group_moved_counts_for_no_owner_and_the_cap_holds(
        make_queue: Any, aconn: Any, database_url: str) -> None:
    """f1 moves to owner F2 while its job runs: the slot says F1, so it counts for no one
    in the set of owners at their cap, and F2 is walked; its candidates are passed over
    all the same, F2 locked and counted exactly (its fair_caps row made), and the claim
    takes Pro's jobs."""
    queue = await _setup(make_queue)
    await queue.upsert_group("f1", plan="free", owner_id="F2")
    # F2's count probes its one group (fair_cap_lock): none of the 301 running jobs'
    # entries of jobs_running_idx is read (903, 301 a statement, when the count was
    # one `= ANY` over the groups, planned without statistics).
    assert await _claim_counting(database_url, queue, "jobs_running_idx") == (["p"] * 5, 0)
    assert await run(aconn, queue, "SELECT plan_key, unit FROM {s}.fair_caps"
                     " ORDER BY 2") == [("p:free", "o:F1"), ("p:free", "o:F2")]
    [(pending,)] = await run(aconn, queue, "SELECT count(*) FROM {s}.jobs"
                             " WHERE group_id = 'f1' AND status = 'pending'")
    assert pending == 2


async def test_a_slot_left_by_a_moved_group_never_keeps_its_old_owner_out(
        make_queue: Any, aconn: Any) -> None:
    """F1 (Free, capped at 1) runs one job of f1, then f1 moves to F2: the job's slot
    still says F1, but F1 has nothing running now, so the claim takes F1's other group's
    job first (Free ranks first). Trusted, the slot would leave F1 out as at its cap and
    the claim would take Pro's jobs instead."""
    queue = await _setup(make_queue)
    await queue.upsert_group("f1b", plan="free", owner_id="F1")
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "f1b"}] * 2)
    await queue.upsert_group("f1", plan="free", owner_id="F2")
    jobs = await queue.claim("t", 3)
    assert [j.group_id for j in jobs][:1] == ["f1b"]
    assert sorted((j.group_id or "")[0] for j in jobs) == ["f", "p", "p"]
