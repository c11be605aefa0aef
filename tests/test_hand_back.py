"""Handing back unstarted jobs changes nothing (docs/design.md, "Defer"): at the end of a
budget, on shutdown, or when a stage's quota runs out, claimed jobs whose handlers never
started go back as they were, attempts and deferrals unchanged, as ``release`` does for
a prefetched batch. Before, each such end added a deferral, and with ``max_deferrals``
set, restarts pushed untouched jobs toward giving up."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from rota import JobContext, Pipeline, Queue, Quota, Stage

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")


async def test_runs_that_end_early_leave_untouched_jobs_as_they_were(
    make_queue: Any
) -> None:
    """Each run is told to stop (as at the end of its budget, or a worker's SIGTERM)
    while the first job of its batch runs: the rest of the batch goes back. The third
    job waits through two such ends; with max_deferrals=1 the second used to retire it
    (failed, "deferred more than 1 times")."""
    queue: Queue = await make_queue(max_deferrals=1)
    stop = asyncio.Event()

    async def first_stops_the_run(ctx: JobContext) -> None:
        stop.set()

    ids = [j.id for j in [await queue.enqueue("t", {}) for _ in range(3)] if j]
    pipeline = Pipeline(queue, [Stage("t", 3, 1, first_stops_the_run)])
    released = []
    for _ in range(4):
        stop.clear()
        result = await pipeline.run(time_budget=timedelta(seconds=30), stop=stop)
        assert result.jobs_deferred == 0
        released.append(result.summary.get("released", 0))
    assert released == [2, 1, 0, 0]
    for i in ids:
        job = await queue.get_job(i)
        assert job is not None
        assert (job.status, job.attempts, job.deferrals) == ("done", 1, 0)


async def test_a_cancelled_run_hands_its_unstarted_jobs_back_unchanged(
    make_queue: Any
) -> None:
    queue: Queue = await make_queue(max_deferrals=1)
    running = asyncio.Event()

    async def forever(ctx: JobContext) -> None:
        running.set()
        await asyncio.sleep(3600)

    ids = [j.id for j in [await queue.enqueue("t", {}) for _ in range(2)] if j]
    for _ in range(3):  # three shutdowns
        running.clear()
        task = asyncio.create_task(Pipeline(queue, [Stage("t", 2, 1, forever)]).run())
        await running.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        queue.clock_offset += timedelta(hours=1)  # past the started one's backoff
    jobs = [await queue.get_job(i) for i in ids]
    # The one started each time failed an attempt; the other was never started and is
    # as it was: no deferral, so max_deferrals=1 never retired it.
    assert sorted((j.attempts, j.deferrals) for j in jobs if j) == [(0, 0), (3, 0)]


async def test_unstarted_jobs_of_a_stage_out_of_quota_wait_for_the_reset_uncounted(
    queue: Queue
) -> None:
    api = Quota("api", 100, reset_tz="UTC")

    async def search(ctx: JobContext) -> None:
        await ctx.spend(api, 100)

    ids = [j.id for j in [await queue.enqueue("s", {}) for _ in range(3)] if j]
    result = await Pipeline(queue, [Stage("s", 3, 1, search, quota=api)]).run()
    assert result.stop_reason == "quota_exhausted"
    reset = api.next_reset(await queue.now())
    second, third = [await queue.get_job(i) for i in ids[1:]]
    assert second is not None and third is not None
    # The second ran and was deferred to the reset (DeferJob's rule: a deferral
    # counted, its attempt handed back); the third never started: as it was.
    assert (second.attempts, second.deferrals, second.run_after) == (0, 1, reset)
    assert (third.attempts, third.deferrals, third.run_after) == (0, 0, reset)
