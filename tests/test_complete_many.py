"""Completing a batch in one statement (Queue.complete_many) and the runner's batched
completion of jobs whose handlers returned normally."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import InvalidInput, Job, Pipeline, Queue, Stage

from .test_fast_claim import claim_equals_oracle, recount

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")


async def status(aconn: Any, queue: Queue, job_id: int) -> tuple[str, Any]:
    cur = await aconn.execute(sql.SQL("SELECT status, claim_token FROM {} WHERE id = %s")
                              .format(queue.table("jobs")), [job_id])
    row = await cur.fetchone()
    assert row is not None
    return row[0], row[1]


async def test_complete_many_fences_each_job_by_its_own_claim(
    queue: Queue, aconn: Any, schema: str, database_url: str
) -> None:
    for g in ("a", "b"):
        await queue.upsert_group(g, plan="free")
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}, "group_id": "ab"[i % 2]}
                              for i in range(6)])
    never = await queue.enqueue("t", {"never": True})
    assert never is not None
    first = await queue.claim("t", 2)
    queue.clock_offset = timedelta(minutes=16)  # the first claim's locks go stale
    second = await queue.claim("t", 6)
    reclaimed = {j.id for j in second} & {j.id for j in first}
    assert reclaimed  # the stale jobs were taken again under new claims
    lost = [j for j in first if j.id in reclaimed]
    winners = [j for j in second if j.id not in reclaimed]
    batch: list[Job] = [*lost, never, *winners, winners[0]]
    got = await queue.complete_many(batch)
    # Lost claims and an unclaimed job change nothing; a job listed twice is done once
    # and flagged the same both times.
    assert got == [False] * len(lost) + [False] + [True] * len(winners) + [True]
    for j in winners:
        assert (await status(aconn, queue, j.id))[0] == "done"
    for j in lost:
        st, token = await status(aconn, queue, j.id)
        assert st == "running" and token != j.claim_token
    assert (await status(aconn, queue, never.id))[0] != "done"
    assert await queue.complete_many([]) == []
    with pytest.raises(InvalidInput):
        await queue.complete_many([never.id])  # type: ignore[list-item]
    await queue.run_upkeep()
    assert await recount(aconn, schema) == []
    await claim_equals_oracle(queue, database_url, "t", 5)


async def test_a_job_listed_under_a_lost_claim_and_the_claim_holding_it_is_flagged_by_claim(
    queue: Queue, aconn: Any,
) -> None:
    """The same job under two claims in one call: the first claim's lock went stale and
    the second took it. Only the second's completion is its: flags [False, True], in
    either order, repeated or not, and the row done under the second claim."""
    job = await queue.enqueue("t", {})
    assert job is not None
    [old] = await queue.claim("t", 1)
    queue.clock_offset = timedelta(minutes=16)  # the old claim's lock goes stale
    [new] = await queue.claim("t", 1)
    assert (old.id, new.id) == (job.id, job.id) and old.claim_token != new.claim_token
    assert await queue.complete_many([old]) == [False]
    assert await queue.complete_many([old, new]) == [False, True]
    assert await status(aconn, queue, job.id) == ("done", new.claim_token)
    # A repeat: done by the holding claim before, still lost by the other.
    assert await queue.complete_many([new, old]) == [True, False]
    assert await queue.complete_many([old, new, old]) == [False, True, False]
    assert await queue.complete(old) is False
    assert await queue.claim_states([old, new]) == {job.id: "done"}


async def test_concurrent_batches_of_one_big_group_keep_the_bookkeeping_exact(
    make_queue: Any, aconn: Any, schema: str, database_url: str
) -> None:
    queue: Queue = await make_queue()
    for g in ("big", "s1", "s2"):
        await queue.upsert_group(g, plan="pro" if g == "big" else "free")
    await queue.enqueue_many([{"type": "t", "payload": {"i": i},
                               "group_id": "big" if i % 5 else f"s{1 + i % 2}"}
                              for i in range(1200)])

    async def worker() -> int:
        q: Queue = await make_queue()
        done = 0
        while batch := await q.claim("t", 40):
            done += sum(await q.complete_many(batch))
        return done

    done = await asyncio.gather(*(worker() for _ in range(8)))
    assert sum(done) == 1200
    await queue.run_upkeep()
    assert await recount(aconn, schema) == []
    await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": g}
                              for g in ("big", "s1", "s2", "s1")])
    await claim_equals_oracle(queue, database_url, "t", 3)


async def test_a_deadlock_falls_back_to_one_statement_per_job(
    queue: Queue, aconn: Any, schema: str, database_url: str
) -> None:
    await aconn.execute(sql.SQL(
        "CREATE FUNCTION {}.deadlock() RETURNS bigint LANGUAGE plpgsql AS "
        "$$BEGIN RAISE EXCEPTION 'simulated' USING ERRCODE = 'deadlock_detected'; END$$"
    ).format(sql.Identifier(schema)))
    real = queue.store.sql

    def patched(name: str, **fragments: str) -> Any:
        if name == "complete_many":
            return sql.SQL("SELECT {}.deadlock() FROM unnest(%(ids)s::bigint[], "
                           "%(claim_tokens)s::uuid[]) x WHERE %(offset)s::interval IS NOT NULL"
                           ).format(sql.Identifier(schema))
        return real(name, **fragments)

    queue.store.sql = patched  # type: ignore[method-assign]
    for i in range(3):
        await queue.enqueue("t", {"i": i})
    jobs = await queue.claim("t", 3)
    assert await queue.complete_many(jobs) == [True, True, True]
    for j in jobs:
        assert (await status(aconn, queue, j.id))[0] == "done"
    # On the caller's connection the error is the caller's to handle.
    await queue.enqueue("t", {"i": 9})
    jobs = await queue.claim("t", 1)
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        with pytest.raises(psycopg.errors.DeadlockDetected):
            await queue.complete_many(jobs, conn=c)


async def test_the_runner_completes_fast_handlers_in_few_statements(
    queue: Queue, aconn: Any
) -> None:
    for g in range(5):
        await queue.upsert_group(f"g{g}", plan="free")
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}, "group_id": f"g{i % 5}"}
                              for i in range(100)])
    calls: list[int] = []
    real = queue.complete_many

    async def counting(jobs: list[Job], **kw: Any) -> list[bool]:
        calls.append(len(jobs))
        return await real(jobs, **kw)

    queue.complete_many = counting  # type: ignore[method-assign]
    seen: list[int] = []

    async def handler(ctx: Any) -> None:
        seen.append(ctx.job.id)
        if ctx.job.payload["i"] == 7:
            await ctx.complete()  # settled by the handler: not completed again

    result = await Pipeline(queue, [Stage("t", 50, 4, handler)]).run()
    assert (result.stop_reason, result.jobs_done, result.jobs_failed) == ("no_work", 100, 0)
    assert len(seen) == 100
    assert sum(calls) == 99
    assert len(calls) <= 6  # one or two statements per batch of 50, not one per job
    cur = await aconn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY status")
                              .format(queue.table("jobs")))
    assert await cur.fetchall() == [("done", 100)]


async def test_a_job_lost_before_its_batched_completion_is_counted_lost(
    queue: Queue, aconn: Any
) -> None:
    for i in range(3):
        await queue.enqueue("t", {"i": i})

    async def handler(ctx: Any) -> None:
        if ctx.job.payload["i"] == 1:  # another run reclaims it meanwhile
            await aconn.execute(sql.SQL("UPDATE {} SET claim_token = gen_random_uuid() "
                                        "WHERE id = %s").format(queue.table("jobs")),
                                [ctx.job.id])

    result = await Pipeline(queue, [Stage("t", 3, 1, handler)]).run()
    assert result.jobs_done == 2
    assert result.summary.get("lost") == 1


async def test_a_failing_batched_completion_ends_the_run_in_error_and_fails_the_jobs(
    queue: Queue, aconn: Any
) -> None:
    for i in range(3):
        await queue.enqueue("t", {"i": i})

    async def broken(jobs: list[Job], **kw: Any) -> list[bool]:
        raise psycopg.OperationalError("the connection broke")

    queue.complete_many = broken  # type: ignore[method-assign]

    async def handler(ctx: Any) -> None:
        return None

    result = await Pipeline(queue, [Stage("t", 3, 1, handler)]).run()
    assert result.stop_reason == "error" and "connection broke" in (result.error or "")
    cur = await aconn.execute(sql.SQL("SELECT status, attempts FROM {} ORDER BY id")
                              .format(queue.table("jobs")))
    # Not done; failed back to pending for a retry (not left running until stale).
    assert await cur.fetchall() == [("pending", 1)] * 3


async def test_after_a_deadlock_each_job_is_completed_with_its_value_and_cost(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-by-one fallback after a deadlock (nothing was written) stores each job's
    value as given, not its encoded text again, and charges each its cost."""
    from decimal import Decimal

    from rota import statements

    async def deadlock(*args: Any, **kwargs: Any) -> set[int]:
        raise psycopg.errors.DeadlockDetected("deadlock detected")

    await queue.enqueue_many([{"type": "t", "payload": {}} for _ in range(2)])
    a, b = await queue.claim("t", 2)
    monkeypatch.setattr(statements, "complete_many", deadlock)
    assert await queue.complete_many([a, b], results=[{"n": 1}, "text"],
                                     costs=[2.5, None]) == [True, True]
    assert (await queue.result(a.id)).value == {"n": 1}
    assert (await queue.result(b.id)).value == "text"
    assert [(await queue.get_job(j.id)).cost for j in (a, b)] == [Decimal("2.5"),
                                                                  Decimal(1)]


@pytest.mark.parametrize("results, costs, refused", [
    ([{"a": 1}, {"a": 2}], None, "results"),
    ([1, True], None, "results"),  # jsonb keeps true apart from 1
    (["\u00e9", "e\u0301"], None, "results"),  # and does not normalize text
    (None, [1, 5], "costs"),
    ([1, 1], [2, None], "costs"),  # no cost charges 1
    # The same stored value twice: one completion.
    ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], None, None),
    ([1, 1.0], None, None),
    ([-0.0, 0.0], None, None),
    ([Decimal("1.50"), 1.5], None, None),
    (None, [1, None], None),
    (None, [Decimal("3"), 3.0], None),
])
async def test_a_job_listed_twice_under_one_claim_must_say_the_same_both_times(
    queue: Queue, aconn: Any, results: Any, costs: Any, refused: str | None,
) -> None:
    """Listed twice under one claim, a job is completed once: with two results (or
    costs) the database would store differently, one would be dropped without a word,
    so the call is refused, naming the job, and nothing is written. Two that it stores
    alike (key order, 1 and 1.0, -0.0 and 0, no cost and a cost of 1) are one
    completion."""
    await queue.enqueue_many([{"type": "t", "payload": {}} for _ in range(2)])
    job, other = await queue.claim("t", 2)
    listed = dict(results=None if results is None else [results[0], None, results[1]],
                  costs=None if costs is None else [costs[0], None, costs[1]])
    if refused:
        with pytest.raises(InvalidInput, match=rf"job {job.id} is listed twice under "
                                               rf"the same claim with different {refused}"):
            await queue.complete_many([job, other, job], **listed)
        assert (await status(aconn, queue, job.id))[0] == "running"
        assert (await status(aconn, queue, other.id))[0] == "running"
        return
    assert await queue.complete_many([job, other, job], **listed) == [True] * 3
    cur = await aconn.execute(sql.SQL("SELECT result = %s::jsonb, cost FROM {} WHERE id = %s")
                              .format(queue.table("jobs")),
                              [None if results is None else json.dumps(float(results[0])
                               if isinstance(results[0], Decimal) else results[0]),
                               job.id])
    assert await cur.fetchone() == (None if results is None else True,
                                    Decimal(3) if costs and costs[0] == 3 else 1)


async def test_a_job_never_claimed_listed_twice_is_not_refused(queue: Queue) -> None:
    """A job with no claim is never written, so two different results for it are not
    refused: its flags are False."""
    job = await queue.enqueue("t", {})
    assert job is not None
    assert await queue.complete_many([job, job], results=[1, 2]) == [False, False]
