"""The runner's three parts, each alone against real PostgreSQL (docs/design.md, "The
runner"): the recorder (the runs row), the batch runner (one batch's handlers and
settling), the run loop (which stage, budget, stop reason); and the queue methods the
runner's transitions go through."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

import rota.job
import rota.runner
from rota import ConfigError, DeferJob, Job, JobContext, Queue, Quota, Schedule, Stage
from rota.runner.batch import BatchRunner
from rota.runner.context import RunState
from rota.runner.loop import RunLoop
from rota.runner.pipeline import Pipeline
from rota.runner.recording import RunRecorder
from rota.schedule import Scheduler
from tests.helpers import enqueue_jobs

AConn = psycopg.AsyncConnection[Any]
BUDGET = timedelta(seconds=60)


def no_quotas(name: str) -> Any:
    raise ConfigError(f"unknown quota {name!r}")


async def rows(aconn: AConn, queue: Queue, table: str, columns: str,
               where: str = "TRUE") -> list[tuple[Any, ...]]:
    cur = await aconn.execute(sql.SQL(f"SELECT {columns} FROM {{}} WHERE {where} ORDER BY 1")
                              .format(queue.table(table)))
    return await cur.fetchall()


async def run_row(aconn: AConn, queue: Queue, run_id: uuid.UUID) -> dict[str, Any]:
    cur = aconn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {} WHERE id = %s").format(queue.table("runs")),
                      [run_id])
    row = await cur.fetchone()
    assert row is not None
    return row


# -- the recorder ------------------------------------------------------------------------

async def test_the_recorder_writes_the_runs_row_at_start_progress_and_end(
        queue: Queue, aconn: AConn) -> None:
    recorder = RunRecorder(queue, timedelta(seconds=100))
    run = RunState(uuid.uuid4(), "manual", BUDGET)
    started_at = await recorder.start(run)
    row = await run_row(aconn, queue, run.id)
    assert (row["trigger"], row["started_at"], row["finished_at"], row["stop_reason"]) == (
        "manual", started_at, None, None)

    run.jobs_done, run.jobs_failed = 3, 1
    run.add("retries", 2)
    await recorder.save_progress(run)  # never saved before: saved now
    row = await run_row(aconn, queue, run.id)
    assert (row["jobs_done"], row["jobs_failed"], row["summary"], row["finished_at"]) == (
        3, 1, {"retries": 2}, None)

    run.jobs_done = 4
    await recorder.save_progress(run)  # within SAVE_EVERY_S of the last save: skipped
    assert (await run_row(aconn, queue, run.id))["jobs_done"] == 3

    finished_at = await recorder.save_end(run, "no_work", None)
    row = await run_row(aconn, queue, run.id)
    assert (row["jobs_done"], row["stop_reason"], row["error"], row["finished_at"]) == (
        4, "no_work", None, finished_at)
    assert run.ended
    run.jobs_done = 9
    await recorder.save_progress(run)  # the end is recorded: nothing saves the row again
    assert (await run_row(aconn, queue, run.id))["jobs_done"] == 4


async def test_the_recorder_records_an_end_whose_summary_the_row_refuses(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = RunRecorder(queue, timedelta(seconds=100))
    run = RunState(uuid.uuid4(), "cli", BUDGET)
    await recorder.start(run)
    real = RunState.save_params

    def refused(self: RunState) -> dict[str, Any]:
        params = real(self)
        if self.summary != {"summary_unstorable": 1}:  # jsonb refuses \u0000
            params["summary"] = '{"a": "\\u0000"}'
        return params

    monkeypatch.setattr(RunState, "save_params", refused)
    run.add("a")
    await recorder.save_end(run, "error", "boom")
    row = await run_row(aconn, queue, run.id)
    assert (row["summary"], row["stop_reason"], row["error"]) == (
        {"summary_unstorable": 1}, "error", "boom")


# -- the queue's transitions the runner uses ----------------------------------------------

async def test_heartbeat_refreshes_only_the_locks_its_claims_hold(queue: Queue,
                                                                  aconn: AConn) -> None:
    await enqueue_jobs(queue, "t", 3)
    a, b, c = await queue.claim("t", 3)
    queue.clock_offset = timedelta(minutes=7)
    lost = dataclasses.replace(a, claim_token=uuid.uuid4())  # another claim's view
    assert await queue.heartbeat([lost, b]) == 1
    assert await queue.heartbeat([]) == 0
    ages = await rows(aconn, queue, "jobs", "id, locked_at > now() + interval '6 minutes'")
    assert ages == [(a.id, False), (b.id, True), (c.id, False)]


async def test_postpone_moves_due_pending_and_dead_running_jobs_to_the_reset(
        make_queue: Any, aconn: AConn) -> None:
    queue: Queue = await make_queue(stale_after=timedelta(minutes=10))
    dead, live, due, later = await enqueue_jobs(queue, "t", 4)
    await queue.enqueue("other", {})
    assert [j.id for j in await queue.claim("t", 2)] == [dead, live]
    async with queue.connection() as c:
        await c.execute(sql.SQL("UPDATE {} SET run_after = now() + interval '5 days' "
                                "WHERE id = %s").format(queue.table("jobs")), [later])
        await c.execute(sql.SQL("UPDATE {} SET locked_at = now() - interval '1 hour' "
                                "WHERE id = %s").format(queue.table("jobs")), [dead])
    reset = await queue.now() + timedelta(hours=2)
    assert await queue.has_pending_by("t", reset)  # `due`
    assert await queue.postpone("t", reset) == 2  # `dead` and `due`
    assert await queue.has_pending_by("t", reset)
    assert not await queue.has_pending_by("t", reset - timedelta(seconds=1))
    got = await aconn.execute(sql.SQL(
        "SELECT id, status, attempts, run_after = %s, claim_token IS NULL FROM {} "
        "ORDER BY id").format(queue.table("jobs")), [reset])
    assert await got.fetchall() == [
        (dead, "pending", 1, True, True), (live, "running", 1, False, False),
        (due, "pending", 0, True, True), (later, "pending", 0, False, True),
        (later + 1, "pending", 0, False, True)]


# -- the batch runner ---------------------------------------------------------------------

async def test_a_batch_settles_each_job_by_how_its_handler_ended(queue: Queue,
                                                               aconn: AConn) -> None:
    ids = await enqueue_jobs(queue, "t", 4)

    async def handler(ctx: JobContext) -> None:
        i = ctx.job.payload["i"]
        if i == 1:
            raise ValueError("no")
        if i == 2:
            raise DeferJob(None)
        if i == 3:
            await ctx.complete()

    run = RunState(uuid.uuid4(), "manual", BUDGET)
    jobs = await queue.claim("t", 4)
    outcome = await BatchRunner(queue, timedelta(seconds=30), no_quotas).run(
        run, Stage("t", 4, 2, handler), jobs)
    assert outcome.blocked is None and outcome.completing is not None
    await outcome.completing
    assert (run.jobs_done, run.jobs_failed, run.jobs_deferred, run.summary, run.held) == (
        2, 0, 1, {"retries": 1}, {})
    assert await rows(aconn, queue, "jobs", "id, status, attempts, deferrals") == [
        (ids[0], "done", 1, 0), (ids[1], "pending", 1, 0), (ids[2], "pending", 0, 1),
        (ids[3], "done", 1, 0)]


async def test_a_batch_after_the_budget_hands_every_job_back_as_it_was(
        queue: Queue, aconn: AConn) -> None:
    ids = await enqueue_jobs(queue, "t", 3)
    ran: list[int] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.job.id)

    stop = asyncio.Event()
    stop.set()
    run = RunState(uuid.uuid4(), "worker", BUDGET, stop=stop)
    jobs = await queue.claim("t", 3)
    outcome = await BatchRunner(queue, timedelta(seconds=30), no_quotas).run(
        run, Stage("t", 3, 1, handler), jobs)
    assert (outcome.completing, outcome.blocked, ran, run.summary) == (
        None, None, [], {"released": 3})
    assert await rows(aconn, queue, "jobs", "id, status, attempts, deferrals") == [
        (i, "pending", 0, 0) for i in ids]


async def test_a_batch_whose_quota_runs_out_says_so_and_hands_back_the_rest(
        queue: Queue, aconn: AConn) -> None:
    quota = Quota("api", 2)
    ids = await enqueue_jobs(queue, "t", 4)

    async def handler(ctx: JobContext) -> None:
        await ctx.spend("api")

    run = RunState(uuid.uuid4(), "manual", BUDGET)
    jobs = await queue.claim("t", 4)
    outcome = await BatchRunner(queue, timedelta(seconds=30), lambda name: quota).run(
        run, Stage("t", 4, 1, handler), jobs)
    assert outcome.completing is None and outcome.blocked is not None
    assert (outcome.blocked.quota, outcome.blocked.reason) == ("api", "exhausted")
    assert (run.jobs_done, run.jobs_deferred, run.quota_units, run.summary) == (
        2, 1, 2, {"quota.api": 2, "quota_deferred": 1, "released": 1})
    assert await rows(aconn, queue, "jobs", "id, status, attempts, deferrals") == [
        (ids[0], "done", 1, 0), (ids[1], "done", 1, 0), (ids[2], "pending", 0, 1),
        (ids[3], "pending", 0, 0)]


# -- the run loop ---------------------------------------------------------------------------

def make_loop(queue: Queue, stages: list[Stage]) -> RunLoop:
    return RunLoop(queue, stages, scheduler=Scheduler(queue, ()),
                   batches=BatchRunner(queue, timedelta(seconds=30), no_quotas),
                   recorder=RunRecorder(queue, timedelta(seconds=100)),
                   hard_limit=timedelta(seconds=90), settle_reserve=timedelta(seconds=10),
                   sizes={}, connections=4)


async def test_the_loop_runs_earlier_stages_first_and_stops_for_no_work(
        queue: Queue, aconn: AConn) -> None:
    order: list[str] = []

    async def first(ctx: JobContext) -> None:
        order.append(f"first{ctx.job.payload['i']}")
        if ctx.job.payload["i"] == 0:
            await ctx.queue.enqueue("first", {"i": 9})  # more first-stage work

    async def second(ctx: JobContext) -> None:
        order.append(f"second{ctx.job.payload['i']}")

    await enqueue_jobs(queue, "second", 2)
    await enqueue_jobs(queue, "first", 2)
    loop = make_loop(queue, [Stage("first", 1, 1, first), Stage("second", 1, 1, second)])
    result = await loop.run("manual", BUDGET)
    assert order == ["first0", "first1", "first9", "second0", "second1"]
    assert (result.stop_reason, result.jobs_done, result.summary) == ("no_work", 5, {})
    row = await run_row(aconn, queue, result.run_id)
    assert (row["stop_reason"], row["jobs_done"], row["finished_at"]) == (
        "no_work", 5, result.finished_at)


async def test_the_loop_claims_nothing_once_asked_to_stop(queue: Queue,
                                                          aconn: AConn) -> None:
    ids = await enqueue_jobs(queue, "t", 2)

    async def handler(ctx: JobContext) -> None:
        raise AssertionError("never started")

    stop = asyncio.Event()
    stop.set()
    result = await make_loop(queue, [Stage("t", 1, 1, handler)]).run(
        "worker", BUDGET, stop=stop)
    assert (result.stop_reason, result.jobs_done, result.summary) == ("interrupted", 0, {})
    assert await rows(aconn, queue, "jobs", "id, status, attempts") == [
        (i, "pending", 0) for i in ids]


async def test_the_loop_skips_a_quota_blocked_stage_and_stops_for_the_quota(
        queue: Queue, aconn: AConn) -> None:
    quota = Quota("api", 5, reserve=4)  # one unit above the reserve
    ids = await enqueue_jobs(queue, "paid", 2)

    async def handler(ctx: JobContext) -> None:
        raise AssertionError("never started")

    loop = make_loop(queue, [Stage("paid", 1, 1, handler, quota=quota, quota_cost=2)])
    result = await loop.run("manual", BUDGET)
    assert (result.stop_reason, result.jobs_done, result.summary) == (
        "quota_reserve", 0, {"postponed": 2})
    assert await rows(aconn, queue, "jobs", "id, status, attempts, run_after > now()") == [
        (i, "pending", 0, True) for i in ids]


# -- the pipeline's constructor and boundaries ------------------------------------------------

async def test_building_a_pipeline_leaves_the_callers_queue_exactly_as_it_was(
    make_queue: Any,
) -> None:
    """The stages' rules are the pipeline's own queue's (docs/design.md, "The runner"):
    built or refused, a pipeline changes nothing on the queue it is given."""
    async def handler(ctx: JobContext) -> None:
        pass

    async def hook(job: Job, conn: Any) -> None:
        pass

    async def callers_hook(job: Job, conn: Any) -> None:
        pass

    queue = await make_queue(max_attempts_by_type={"b": 4})
    queue.on_give_up("c", callers_hook)
    state = dict(vars(queue))
    settings = dict(vars(queue.settings))
    stages = [Stage("a", 1, 1, handler, max_attempts=2, on_give_up=hook),
              Stage("b", 1, 1, handler), Stage("c", 1, 1, handler)]
    with pytest.raises(ConfigError, match="schedule 'tick' enqueues 'x'"):
        Pipeline(queue, stages, schedules=[Schedule(name="tick", cron="0 * * * *", type="x")])
    with pytest.raises(ConfigError, match="stage 'b': max_attempts 3 conflicts with the "
                                          "queue's max_attempts_by_type 4"):
        Pipeline(queue, [stages[0], Stage("b", 1, 1, handler, max_attempts=3)])
    pipeline = Pipeline(queue, stages)

    assert dict(queue.max_attempts_by_type) == {"b": 4}
    assert dict(queue.give_up_hooks) == {"c": callers_hook}
    assert vars(queue) == state and vars(queue.settings) == settings
    # The pipeline's queue: the stages' rules over the caller's, on the same pool.
    assert pipeline.queue is not queue
    assert dict(pipeline.queue.max_attempts_by_type) == {"a": 2, "b": 4}
    assert dict(pipeline.queue.give_up_hooks) == {
        "a": hook, "b": rota.job.no_give_up_hook, "c": callers_hook}
    assert (pipeline.queue.pool, pipeline.queue.store, pipeline.queue.upkeep) == (
        queue.pool, queue.store, queue.upkeep)


RUNNER = Path(rota.runner.__file__).parent


@pytest.mark.parametrize("module", ["batch.py", "loop.py", "pipeline.py", "context.py",
                                    "completer.py", "stage.py", "batching.py",
                                    "settle.py", "rates.py"])
def test_only_the_recorder_issues_statements_of_its_own(module: str) -> None:
    """Job transitions go through Queue methods: no runner module but the recorder
    (the runs row) touches the store or names a statement."""
    tree = ast.parse((RUNNER / module).read_text())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert used & {"store", "execute", "fetch_one", "fetch_all", "sql"} == set()
