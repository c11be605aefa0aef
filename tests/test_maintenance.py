"""Maintenance: stuck jobs and their give-up hooks, killed runs, pruning done jobs."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from rota import (
    ConfigError,
    Job,
    JobContext,
    KilledRuns,
    Maintenance,
    Pipeline,
    PruneDoneJobs,
    Queue,
    Quota,
    Stage,
    maintain,
)

AConn = psycopg.AsyncConnection[Any]

QUIET = {"stuck_jobs.failed": 0, "stuck_jobs.hooks_run": 0, "killed_runs.marked": 0,
         "prune.jobs_deleted": 0, "prune.quota_rows_deleted": 0,
         "prune.runs_deleted": 0}


async def start_run(queue: Queue) -> uuid.UUID:
    """Write a run's start row exactly as the runner does, and never finish it (the
    process running it was killed)."""
    run_id = uuid.uuid4()
    async with queue.connection() as c:
        await c.execute(queue.sql("run_start"), {"id": run_id, "trigger": "cron",
                                                 "offset": queue.clock_offset,
                                                 "worker": "killed-host:1"})
    return run_id


async def runs(aconn: AConn, queue: Queue) -> dict[uuid.UUID, dict[str, Any]]:
    cur = aconn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {}").format(queue.table("runs")))
    return {r["id"]: r for r in await cur.fetchall()}


async def done_job(queue: Queue, age: timedelta) -> int:
    """A job that finished ``age`` ago on the queue's clock."""
    saved = queue.clock_offset
    queue.clock_offset = saved - age
    try:
        j = await queue.enqueue("work", {})
        assert j is not None
        [claimed] = await queue.claim("work", 1)
        assert await queue.complete(claimed)
        return j.id
    finally:
        queue.clock_offset = saved


# -- stuck jobs and give-up hooks -------------------------------------------------------


async def test_stuck_jobs_fail_and_their_give_up_hooks_run_once(make_queue: Any) -> None:
    queue: Queue = await make_queue()
    refunds: list[int] = []

    async def refund(job: Job, conn: AConn) -> None:
        refunds.append(job.id)

    queue.on_give_up("draft", refund)
    stuck = await queue.enqueue("draft", {}, max_attempts=1)
    alive = await queue.enqueue("draft", {}, max_attempts=2)
    assert stuck is not None and alive is not None
    assert len(await queue.claim("draft", 2)) == 2  # the process running them dies

    queue.clock_offset = timedelta(minutes=14)
    assert await maintain(queue) == QUIET  # not stale yet

    queue.clock_offset = timedelta(minutes=16)
    assert await maintain(queue) == {**QUIET, "stuck_jobs.failed": 1}
    assert refunds == [stuck.id]
    j = await queue.get_job(stuck.id)
    assert j is not None and (j.status, j.give_up_pending) == ("failed", False)
    assert j.last_error is not None and j.last_error.startswith("stuck")
    # The other one has attempts left: it is reclaimable, not stuck.
    a = await queue.get_job(alive.id)
    assert a is not None and a.status == "running"

    assert await maintain(queue) == QUIET
    assert refunds == [stuck.id]


async def test_hooks_owed_by_a_process_without_them_run_at_maintenance(
        make_queue: Any) -> None:
    without: Queue = await make_queue()
    j = await without.enqueue("draft", {}, max_attempts=1)
    assert j is not None
    [claimed] = await without.claim("draft", 1)
    assert await without.fail(claimed, "boom") == "failed"  # no hook here: owed

    refunds: list[int] = []

    async def refund(job: Job, conn: AConn) -> None:
        refunds.append(job.id)

    with_hooks: Queue = await make_queue()
    with_hooks.on_give_up("draft", refund)
    assert await maintain(with_hooks) == {**QUIET, "stuck_jobs.hooks_run": 1}
    assert await maintain(with_hooks) == QUIET
    assert refunds == [j.id]


# -- killed runs ------------------------------------------------------------------------


async def test_runs_silent_past_the_stale_window_are_marked_killed(
        queue: Queue, aconn: AConn) -> None:
    """One rule for "dead": a run silent for longer than the queue's stale window (15
    minutes here), when its jobs are reclaimed too, whatever platform timeout the caller
    knows (docs/design.md, "Maintenance")."""
    assert queue.stale_after == timedelta(minutes=15)
    killed = await start_run(queue)

    async def handler(ctx: JobContext) -> None:
        pass

    finished = (await Pipeline(queue, [Stage("x", 1, 1, handler)]).run()).run_id

    queue.clock_offset = timedelta(minutes=14)
    assert (await KilledRuns(queue).run_once()) == {"marked": 0}
    assert 59 < (await KilledRuns(queue).next_in() or 0) <= 60
    alive = await start_run(queue)  # started at +14 minutes

    queue.clock_offset = timedelta(minutes=15, seconds=1)
    assert (await KilledRuns(queue).next_in() or 0) < 0  # due to be marked now
    assert (await KilledRuns(queue, platform_timeout=timedelta(hours=1)).run_once()
            ) == {"marked": 1}
    rows = await runs(aconn, queue)
    assert (rows[killed]["stop_reason"], rows[killed]["error"]) == ("error", "killed")
    # It ended at its last sign of life, not when the sweep noticed.
    assert rows[killed]["finished_at"] == rows[killed]["started_at"]
    assert rows[alive]["finished_at"] is None
    assert (rows[finished]["stop_reason"], rows[finished]["error"]) == ("no_work", None)

    # A run that keeps saving progress is alive however long it has been running.
    queue.clock_offset = timedelta(minutes=20)
    async with queue.connection() as c:
        await c.execute(queue.sql("run_save"), {
            "id": alive, "jobs_done": 3, "jobs_failed": 0, "jobs_deferred": 0,
            "quota_units": 0, "summary": "{}", "final": False, "stop_reason": None,
            "error": None, "offset": queue.clock_offset})
    queue.clock_offset = timedelta(minutes=34, seconds=59)
    assert (await KilledRuns(queue).run_once()) == {"marked": 0}
    queue.clock_offset = timedelta(minutes=35, seconds=1)
    assert (await KilledRuns(queue).run_once()) == {"marked": 1}
    assert await KilledRuns(queue).next_in() is None  # no unfinished run left
    assert (await runs(aconn, queue))[alive]["jobs_done"] == 3


# -- pruning ----------------------------------------------------------------------------


async def test_pruning_deletes_only_done_jobs_older_than_the_retention(
        queue: Queue) -> None:
    old = [await done_job(queue, timedelta(days=d)) for d in (8, 9, 30)]
    recent = await done_job(queue, timedelta(days=3))
    fresh = await done_job(queue, timedelta(hours=1))
    queue.clock_offset = -timedelta(days=30)
    pending = await queue.enqueue("work", {})
    failed = await queue.enqueue("fail", {}, max_attempts=1)
    assert pending is not None and failed is not None
    [f] = await queue.claim("fail", 1)
    assert await queue.fail(f, "boom") == "failed"
    await Quota("api", 100).spend(queue, 5)  # a 30-day-old period's usage
    queue.clock_offset = timedelta(0)
    await Quota("api", 100).spend(queue, 7)

    prune = PruneDoneJobs(queue, retention=timedelta(days=7), batch_size=2)
    assert await prune.run_once() == {"jobs_deleted": 3, "quota_rows_deleted": 1,
                                     "runs_deleted": 0}
    for i in old:
        assert await queue.get_job(i) is None
    for i in (recent, fresh, pending.id, failed.id):
        assert await queue.get_job(i) is not None
    assert (await Quota("api", 100).usage(queue)).used == 7

    # The shortest retention allowed is the served window: the fresh job stays.
    prune = PruneDoneJobs(queue, retention=queue.served_window)
    assert await prune.run_once() == {"jobs_deleted": 1, "quota_rows_deleted": 0,
                                     "runs_deleted": 0}
    assert await queue.get_job(recent) is None
    assert await queue.get_job(fresh) is not None


async def test_a_retention_shorter_than_the_served_window_is_refused(
        make_queue: Any) -> None:
    queue: Queue = await make_queue(served_window=timedelta(days=2))
    with pytest.raises(ConfigError, match="served window"):
        PruneDoneJobs(queue, retention=timedelta(days=1))
    with pytest.raises(ConfigError, match="served window"):
        await maintain(queue, retention=timedelta(hours=47))
    PruneDoneJobs(queue, retention=timedelta(days=2))


# -- one shape, counters in the run summary --------------------------------------------


async def test_maintenance_counters_land_in_the_run_summary(queue: Queue,
                                                            aconn: AConn) -> None:
    killed = await start_run(queue)
    await done_job(queue, timedelta(days=10))
    queue.clock_offset = timedelta(minutes=16)  # past the stale window

    async def handler(ctx: JobContext) -> None:
        pass

    pipeline = Pipeline(queue, [Stage("x", 1, 1, handler)])
    # A Maintenance built on the queue given to Pipeline would run no stage's give-up
    # hook for its stuck jobs: the run refuses it, saying what to do.
    with pytest.raises(ConfigError) as refused:
        await pipeline.run(maintenance=Maintenance(queue))
    assert str(refused.value) == (
        "maintenance is built on another queue than the pipeline's, so the stages' "
        "give-up hooks would not run for its stuck jobs: build it on pipeline.queue "
        "(rota.Maintenance(pipeline.queue, ...))")
    result = await pipeline.run(maintenance=Maintenance(pipeline.queue))
    assert result.summary == {
        "maintenance.stuck_jobs.failed": 0, "maintenance.stuck_jobs.hooks_run": 0,
        "maintenance.killed_runs.marked": 1, "maintenance.prune.jobs_deleted": 1,
        "maintenance.prune.quota_rows_deleted": 0,
        "maintenance.prune.runs_deleted": 0,
    }
    rows = await runs(aconn, queue)
    assert rows[result.run_id]["summary"] == result.summary
    assert rows[killed]["error"] == "killed"


async def test_a_worker_refuses_at_start_a_maintenance_without_its_stages_hooks(
    queue: Queue,
) -> None:
    """Rather than a run that fails on it again and again."""
    from rota import Worker

    async def handler(ctx: JobContext) -> None:
        pass

    pipeline = Pipeline(queue, [Stage("x", 1, 1, handler)])
    worker = Worker(pipeline, maintenance=Maintenance(queue))
    with pytest.raises(ConfigError, match=r"^maintenance is built on another queue than "
                                          r"the pipeline's"):
        await asyncio.wait_for(worker.run_forever(asyncio.Event()), 10)
    assert worker.runs == 0
