"""A pipeline's rules are its own queue's (docs/design.md, "The runner"): its stages'
``max_attempts`` apply to what is enqueued through ``pipeline.queue`` (the runner, its
handlers' ``ctx.queue``, its schedules, the CLI with ``--app``), its stages' give-up
hooks run wherever that queue is used (the runner, maintenance, the worker, a cancel),
and the queue the pipeline was given keeps only its own settings."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Job, JobContext, Pipeline, Queue, Schedule, Stage, admin, maintain
from rota.worker import Worker

AConn = psycopg.AsyncConnection[Any]
BUDGET = timedelta(seconds=30)


async def nothing(ctx: JobContext) -> None:
    pass


async def attempts_of(aconn: AConn, queue: Queue) -> dict[int, tuple[str, int]]:
    cur = await aconn.execute(sql.SQL("SELECT id, type, max_attempts FROM {} ORDER BY id")
                              .format(queue.table("jobs")))
    return {r[0]: (r[1], r[2]) for r in await cur.fetchall()}


async def test_a_stage_type_enqueued_through_the_pipelines_queue_gets_the_stages_attempts(
    queue: Queue, aconn: AConn,
) -> None:
    async def fan_out(ctx: JobContext) -> None:
        await ctx.queue.enqueue("draft", {"from": ctx.job.id})  # the handler's way

    pipeline = Pipeline(queue, [
        Stage("draft", 1, 1, nothing, max_attempts=7),
        Stage("search", 1, 1, fan_out),
    ], schedules=[Schedule(name="hourly", cron="0 * * * *", type="draft")])
    p = pipeline.queue
    await p.enqueue("draft", {"n": 1})                                   # job 1
    await p.enqueue_many([{"type": "draft", "payload": {"n": 2}}])       # job 2
    await queue.enqueue("draft", {"n": 3})  # job 3: the caller's queue, its own setting
    await p.enqueue("draft", {"n": 4}, max_attempts=2)  # job 4: an explicit value wins
    await p.enqueue("search", {})                                        # job 5
    assert await attempts_of(aconn, queue) == {
        1: ("draft", 7), 2: ("draft", 7), 3: ("draft", 3), 4: ("draft", 2),
        5: ("search", 3)}

    await aconn.execute(sql.SQL("DELETE FROM {} WHERE id <= 4").format(queue.table("jobs")))
    # The run: its schedule's first tick is owed from now on, so move an hour on.
    await pipeline.run(trigger="manual", time_budget=BUDGET)
    queue.clock_offset = timedelta(hours=1, minutes=1)
    await pipeline.run(trigger="manual", time_budget=BUDGET)
    found = await attempts_of(aconn, queue)
    assert sorted(found.values()) == [("draft", 7), ("draft", 7), ("search", 3)]


async def test_the_sql_functions_get_the_stages_attempts_from_the_pipelines_queue(
    queue: Queue, aconn: AConn,
) -> None:
    pipeline = Pipeline(queue, [Stage("draft", 1, 1, nothing, max_attempts=7)])
    query = sql.SQL("SELECT max_attempts_by_type FROM {}.enqueue_settings").format(
        sql.Identifier(queue.schema))
    await queue.publish_settings()
    assert await (await aconn.execute(query)).fetchall() == [({},)]
    await pipeline.queue.publish_settings()  # what `rota migrate --app` does
    assert await (await aconn.execute(query)).fetchall() == [({"draft": 7},)]
    await aconn.execute(sql.SQL("SELECT {}.enqueue('draft', '{{}}')").format(
        sql.Identifier(queue.schema)))
    assert await attempts_of(aconn, queue) == {1: ("draft", 7)}


async def test_two_pipelines_on_one_queue_each_keep_their_own_rules(
    queue: Queue, aconn: AConn,
) -> None:
    async def hook_a(job: Job, conn: Any) -> None:
        pass

    async def hook_b(job: Job, conn: Any) -> None:
        pass

    a = Pipeline(queue, [Stage("draft", 1, 1, nothing, max_attempts=2, on_give_up=hook_a)])
    b = Pipeline(queue, [Stage("draft", 1, 1, nothing, max_attempts=5, on_give_up=hook_b)])
    await a.queue.enqueue("draft", {})
    await b.queue.enqueue("draft", {})
    assert await attempts_of(aconn, queue) == {1: ("draft", 2), 2: ("draft", 5)}
    assert (dict(a.queue.give_up_hooks), dict(b.queue.give_up_hooks),
            dict(queue.give_up_hooks)) == ({"draft": hook_a}, {"draft": hook_b}, {})


async def test_the_pipelines_queue_shares_the_clock_and_the_pool_and_closes_nothing(
    make_queue: Any,
) -> None:
    queue: Queue = await make_queue()
    pipeline = Pipeline(queue, [Stage("draft", 1, 1, nothing)])
    queue.clock_offset = timedelta(hours=1)
    assert pipeline.queue.clock_offset == timedelta(hours=1)
    pipeline.queue.clock_offset = timedelta(hours=2)
    assert queue.clock_offset == timedelta(hours=2)

    await pipeline.queue.close()  # the pool is the caller's queue's: still open
    assert not queue.pool.closed
    job = await pipeline.queue.enqueue("draft", {})
    assert job is not None and job.id == 1
    await queue.close()
    assert queue.pool.closed


async def test_a_hook_registered_on_the_callers_queue_later_still_runs_for_the_pipeline(
    queue: Queue,
) -> None:
    """The pipeline's queue reads the caller's hooks live, under its stages'."""
    ran: list[int] = []

    async def boom(ctx: JobContext) -> None:
        raise RuntimeError("no")

    async def refund(job: Job, conn: Any) -> None:
        ran.append(job.id)

    pipeline = Pipeline(queue, [Stage("draft", 1, 1, boom, max_attempts=1)])
    queue.on_give_up("draft", refund)
    await pipeline.queue.enqueue("draft", {})
    result = await pipeline.run(trigger="manual", time_budget=BUDGET)
    assert (result.jobs_failed, ran) == (1, [1])


async def stuck_draft(pipeline: Pipeline) -> Job:
    """A ``draft`` job whose one attempt died: running, its lock past the stale window."""
    job = await pipeline.queue.enqueue("draft", {})
    assert job is not None and job.max_attempts == 1
    assert [j.id for j in await pipeline.queue.claim("draft", 1)] == [job.id]
    pipeline.queue.clock_offset = pipeline.queue.stale_after + timedelta(minutes=1)
    return job


async def test_maintenance_runs_the_stages_hooks_through_the_pipelines_queue(
    queue: Queue,
) -> None:
    refunds: list[int] = []

    async def refund(job: Job, conn: Any) -> None:
        refunds.append(job.id)

    pipeline = Pipeline(queue, [Stage("draft", 1, 1, nothing, max_attempts=1,
                                      on_give_up=refund)])
    job = await stuck_draft(pipeline)
    # The caller's queue has no hook for draft: the give-up stays owed...
    assert (await maintain(queue))["stuck_jobs.failed"] == 1
    got = await queue.get_job(job.id)
    assert got is not None and (got.status, got.give_up_pending, refunds) == (
        "failed", True, [])
    assert admin.give_up_hook_state("draft", "failed", False, queue.give_up_hooks) == (
        "not owed")
    # ...for the pipeline's queue, which runs it.
    assert (await maintain(pipeline.queue))["stuck_jobs.hooks_run"] == 1
    got = await queue.get_job(job.id)
    assert got is not None and (got.give_up_pending, refunds) == (False, [job.id])
    assert admin.give_up_hook_state(
        "draft", "failed", False, pipeline.queue.give_up_hooks) == "ran"


async def test_a_cancel_runs_the_stages_hook_through_the_pipelines_queue(
    queue: Queue,
) -> None:
    refunds: list[int] = []

    async def refund(job: Job, conn: Any) -> None:
        refunds.append(job.id)

    pipeline = Pipeline(queue, [Stage("draft", 1, 1, nothing, on_give_up=refund)])
    job = await queue.enqueue("draft", {})
    assert job is not None
    await admin.cancel_job(queue, job.id)
    assert await queue.run_give_up_hooks([job.id]) == 0
    assert await pipeline.queue.run_give_up_hooks([job.id]) == 1
    assert refunds == [job.id]


@pytest.mark.parametrize("mode", ["rescue", "maintenance"])
async def test_a_worker_given_the_callers_queue_runs_the_stages_hooks(
    queue: Queue, mode: str,
) -> None:
    """``Worker(pipeline, queue=queue)`` listens on ``queue``; its rescue and its
    maintenance run the pipeline's hooks."""
    refunds: list[int] = []
    refunded = asyncio.Event()

    async def refund(job: Job, conn: Any) -> None:
        refunds.append(job.id)
        refunded.set()

    pipeline = Pipeline(queue, [Stage("draft", 1, 1, nothing, max_attempts=1,
                                      on_give_up=refund)])
    job = await stuck_draft(pipeline)
    worker = Worker(pipeline, queue=queue,
                    maintain_every=timedelta(days=1) if mode == "maintenance" else None,
                    rescue_every=(timedelta(milliseconds=50) if mode == "rescue"
                                  else None))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run_forever(stop))
    try:
        await asyncio.wait_for(refunded.wait(), 10)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert refunds == [job.id]
