"""The runner cannot starve itself of connections (docs/design.md, "Connections"): the
queue's own pool is grown to what the stages need (a connection per concurrent handler
and ``RUNNER_CONNECTIONS`` for the runner), a caller's pool too small is refused at
start, and a handler that cannot get a connection from rota's pool hands its job back
as it was: a missing connection is rota's failure, not the job's."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from rota import ConfigError, JobContext, Pipeline, Queue, Stage
from rota.runner.pipeline import RUNNER_CONNECTIONS


async def test_the_queues_own_pool_grows_to_what_the_stages_need(
    database_url: str, schema: str, make_queue: Any
) -> None:
    """The issue's setup: stage concurrency equal to the pool size (10) gave only a
    warning, and handlers holding a connection made the others time out, each timeout
    burning an attempt (6 of 8 jobs). Now the pool grows to 12 and every job is done on
    its first attempt."""
    await make_queue()
    queue = Queue(database_url, schema=schema)  # its own pool: max_size 10
    async with queue:
        assert queue.owns_pool and queue.pool.max_size == 10
        holding = 0
        all_hold = asyncio.Event()

        async def handler(ctx: JobContext) -> None:
            nonlocal holding
            async with ctx.connection() as conn:
                holding += 1
                if holding == 8:
                    all_hold.set()
                await asyncio.wait_for(all_hold.wait(), 10)
                await conn.execute("SELECT 1")

        ids = [j.id for j in [await queue.enqueue("t", {"n": i}) for i in range(8)] if j]
        pipeline = Pipeline(queue, [Stage("t", 8, 10, handler)])
        assert pipeline.connections_needed == 10 + RUNNER_CONNECTIONS == 12
        result = await pipeline.run(time_budget=timedelta(seconds=30))
        assert queue.pool.max_size == 12
        assert (result.stop_reason, result.jobs_done, result.summary) == ("no_work", 8, {})
        for i in ids:
            job = await queue.get_job(i)
            assert job is not None and (job.status, job.attempts) == ("done", 1)


async def test_a_callers_pool_too_small_is_refused_at_start(
    database_url: str, schema: str, make_queue: Any
) -> None:
    await make_queue()
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, min_size=1, max_size=10, open=False, kwargs={"autocommit": True})
    queue = Queue(pool, schema=schema)

    async def handler(ctx: JobContext) -> None:
        pass

    async def batch(ctxs: list[JobContext]) -> None:
        pass

    with pytest.raises(ConfigError, match=(
            "stage 'wide': concurrency 10 needs a pool of at least 12 connections \\(one "
            "per handler and 2 for the runner\\); the queue's pool has max_size 10: "
            "raise it or lower the concurrency")):
        Pipeline(queue, [Stage("narrow", 5, 2, handler), Stage("wide", 5, 10, handler)])
    Pipeline(queue, [Stage("wide", 5, 8, handler)])  # 8 + 2 fits
    # A batch handler is one call, whatever the concurrency.
    Pipeline(queue, [Stage("batch", 50, 50, batch_handler=batch)])


async def test_a_handler_that_cannot_get_a_connection_hands_its_job_back(
    database_url: str, schema: str, make_queue: Any
) -> None:
    """A pool of 3 with a 0.3 s timeout; the handler asks for four connections at once.
    The job is not failed: it goes back pending with no attempt used and no deferral,
    is not run again in this run, is due again once the run has ended, and runs once a
    connection can be had."""
    await make_queue()
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, min_size=1, max_size=3, timeout=0.3, open=False,
        kwargs={"autocommit": True})
    await pool.open(wait=True)
    try:
        queue = Queue(pool, schema=schema)
        greedy = True
        calls = 0

        async def handler(ctx: JobContext) -> None:
            nonlocal calls
            calls += 1
            if not greedy:
                return
            async with ctx.connection(), ctx.connection(), ctx.connection(), \
                    ctx.connection():
                pass

        job = await queue.enqueue("t", {})
        assert job
        pipeline = Pipeline(queue, [Stage("t", 1, 1, handler)])
        result = await pipeline.run(time_budget=timedelta(seconds=1))
        assert (result.jobs_done, result.jobs_failed) == (0, 0)
        assert result.summary == {"pool_timeouts": 1, "released": 1}
        got = await queue.get_job(job.id)
        assert got is not None
        assert (got.status, got.attempts, got.deferrals, got.last_error) == (
            "pending", 0, 0, None)
        assert calls == 1  # not again in the run that gave it back
        assert got.run_after <= await queue.now()  # due again: that run has ended
        greedy = False
        assert (await pipeline.run(time_budget=timedelta(seconds=1))).jobs_done == 1
        assert calls == 2
    finally:
        await pool.close()
