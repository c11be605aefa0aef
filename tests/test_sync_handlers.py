"""A sync (``def``) handler runs in a thread of its own, and a thread cannot be
cancelled (docs/design.md, "Handler deadlines"): while it runs its job is never handed
back, retried or let go stale, its lock kept fresh; past its timeout it is overdue
(counted, logged) and fails with ``rota.HandlerTimedOut`` only once the thread has
returned; the run waits for it past its own hard deadline. A sync ``batch_handler`` is
refused when the stage is built."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import InvalidInput, JobContext, Pipeline, Queue, Stage
from tests.helpers import job_state

AConn = psycopg.AsyncConnection[Any]


def test_a_sync_handler_completes_its_job_with_its_return_value() -> None:
    stage = Stage("t", 1, 1, lambda ctx: {"id": ctx.job.id})
    assert stage.sync is True

    async def handler(ctx: JobContext) -> None:
        return None

    assert Stage("t", 1, 1, handler).sync is False


async def test_a_sync_handler_runs_in_a_thread_and_completes(queue: Queue) -> None:
    seen: list[str] = []

    def handler(ctx: JobContext) -> dict[str, Any]:
        seen.append(threading.current_thread().name)
        time.sleep(0.05)  # blocks its thread, never the event loop
        return {"doubled": ctx.job.payload["n"] * 2}

    job = await queue.enqueue("t", {"n": 21})
    assert job
    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run(
        time_budget=timedelta(seconds=5))
    assert (result.stop_reason, result.jobs_done, result.summary) == ("no_work", 1, {})
    assert seen == [f"rota-job-{job.id}"]
    assert (await queue.result(job.id)).value == {"doubled": 42}


async def test_a_sync_batch_handler_is_refused_in_one_line() -> None:
    def batch(ctxs: list[JobContext]) -> None:
        return None

    with pytest.raises(InvalidInput, match="^stage 't': batch_handler must be an async def "
                                           r"\(a sync handler runs as handler=, one job per "
                                           r"call\)$"):
        Stage("t", 1, batch_handler=batch)  # type: ignore[arg-type]


async def test_an_overdue_sync_handler_keeps_its_job_until_its_thread_returns(
    make_queue: Any, aconn: AConn
) -> None:
    # The handler's timeout (0.3 s) and the run's hard deadline (platform timeout 2 s)
    # both pass while the first attempt's thread runs 3 s, longer than the stale window
    # (2.5 s); the job's lock stays fresh all along and a second pipeline claiming
    # meanwhile on the same queue (no backoff: a retry is due at once) never gets it.
    # Then it fails with a real error, and only then is it retried.
    queue: Queue = await make_queue(stale_after=timedelta(seconds=2.5),
                                    backoff_base=timedelta(0))
    ran: list[list[Any]] = []  # [attempt, started, ended] per execution
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def slow(ctx: JobContext) -> None:
        ran.append([ctx.job.attempts, time.monotonic(), None])
        loop.call_soon_threadsafe(started.set)
        if ctx.job.attempts == 1:
            time.sleep(3)
        ran[-1][2] = time.monotonic()

    job = await queue.enqueue("t", {})
    assert job
    stage = Stage("t", 1, 1, slow, timeout=timedelta(seconds=0.3))
    first, other = (Pipeline(queue, [stage], platform_timeout=timedelta(seconds=2),
                             heartbeat_every=timedelta(seconds=0.25)) for _ in range(2))
    t0 = time.monotonic()
    running = asyncio.create_task(first.run(time_budget=timedelta(seconds=0.5)))
    await started.wait()
    locked: list[Any] = []
    while not running.done():
        await other.run(time_budget=timedelta(seconds=0.2))
        row = await (await aconn.execute(sql.SQL(
            "SELECT status, attempts, locked_at > now() - interval '1 second' "
            "FROM {} WHERE id = %s").format(queue.table("jobs")), (job.id,))).fetchone()
        if ran and ran[0][2] is None:  # the first attempt's thread still runs
            locked.append(row)
        await asyncio.sleep(0.2)
    result = await running
    assert 2.9 < time.monotonic() - t0 < 4.5
    assert len(locked) >= 5 and set(locked) == {("running", 1, True)}, locked
    # Its budget (0.5 s) ended while it waited for the thread.
    assert (result.stop_reason, result.jobs_done, result.jobs_failed) == (
        "time_budget", 0, 0)
    assert result.summary == {"overdue": 1, "timed_out": 1, "retries": 1}
    found = await queue.result(job.id)
    assert found.errors[0].error_type == "rota.errors.HandlerTimedOut"
    assert found.errors[0].error.startswith("HandlerTimedOut: the sync handler ran 3.")
    assert found.errors[0].error.endswith(
        " s, past its 0.3 s timeout (a thread cannot be cancelled)")
    trace = found.errors[0].traceback or ""
    assert "where the thread was at the timeout:" in trace
    assert "time.sleep(3)" in trace  # the thread's own frame, not rota's
    await other.run(time_budget=timedelta(seconds=1))
    assert [r[0] for r in ran] == [1, 2]
    assert ran[1][1] >= ran[0][2]  # the retry started after the first thread returned
    assert (await job_state(aconn, queue, job.id))[:2] == ("done", 2)


async def test_a_sync_handler_that_returns_within_its_timeout_completes_after_the_run_deadline(
    queue: Queue,
) -> None:
    # The run's hard deadline (1.5 s: a 2 s platform timeout less its 0.5 s reserve)
    # passes while the thread runs; its own timeout (1.9 s) has not: the run waits for
    # it, past its budget, and completes it.
    def slow(ctx: JobContext) -> str:
        time.sleep(1.85)
        return "done late"

    job = await queue.enqueue("t", {})
    assert job
    pipeline = Pipeline(queue, [Stage("t", 1, 1, slow, timeout=timedelta(seconds=1.9))],
                        platform_timeout=timedelta(seconds=2))
    result = await pipeline.run(time_budget=timedelta(seconds=0.5))
    assert (result.stop_reason, result.jobs_done, result.summary) == ("time_budget", 1, {})
    assert (await queue.result(job.id)).value == "done late"


async def test_a_sync_handler_that_raises_fails_its_job_with_its_own_error(
    queue: Queue, aconn: AConn
) -> None:
    def broken(ctx: JobContext) -> None:
        raise KeyError("missing")

    job = await queue.enqueue("t", {})
    assert job
    result = await Pipeline(queue, [Stage("t", 1, 1, broken)]).run(
        time_budget=timedelta(seconds=5))
    assert result.summary == {"retries": 1}
    found = await queue.result(job.id)
    assert (found.errors[0].error_type, found.errors[0].error) == (
        "builtins.KeyError", "KeyError: 'missing'")


@pytest.mark.parametrize(("sleep", "status"), [(0.5, "done"), (5, "running")])
async def test_a_hard_stop_waits_for_a_sync_handler_up_to_the_platform_timeout(
    queue: Queue, aconn: AConn, sleep: float, status: str,
) -> None:
    # A stop request, then the run cancelled (a second signal): the thread that returns
    # within the platform timeout (2 s) completes its job; one that does not is left
    # running, to the stale-lock rules, never handed back while it runs.
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def slow(ctx: JobContext) -> str:
        loop.call_soon_threadsafe(started.set)
        time.sleep(sleep)
        return "finished"

    job = await queue.enqueue("t", {})
    assert job
    pipeline = Pipeline(queue, [Stage("t", 1, 1, slow, timeout=timedelta(seconds=1.5))],
                        platform_timeout=timedelta(seconds=2))
    stop = asyncio.Event()
    t0 = time.monotonic()
    running = asyncio.create_task(pipeline.run(time_budget=timedelta(seconds=1), stop=stop))
    await started.wait()
    stop.set()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    elapsed = time.monotonic() - t0
    state = await job_state(aconn, queue, job.id)
    assert state[:2] == (status, 1)
    if status == "done":
        assert 0.5 <= elapsed < 1.5
        assert (await queue.result(job.id)).value == "finished"
    else:
        assert 1.9 < elapsed < 3.5  # the platform timeout from the run's start
        assert (await queue.result(job.id)).errors == []


async def test_the_dashboards_run_page_shows_the_overdue_count_and_the_worker(
    queue: Queue,
) -> None:
    import httpx

    from rota import dashboard_app

    def slow(ctx: JobContext) -> None:
        time.sleep(0.5)

    await queue.enqueue("t", {})
    result = await Pipeline(queue, [Stage("t", 1, 1, slow, timeout=timedelta(seconds=0.2))]
                            ).run(time_budget=timedelta(seconds=5))
    app = dashboard_app(queue, secret="s" * 32)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1",
                                 headers={"Authorization": "Bearer " + "s" * 32}) as c:
        page = (await c.get(f"/runs/{result.run_id}")).text
    assert f"<dt>worker</dt><dd>{socket.gethostname()}:{os.getpid()}</dd>" in page
    assert '<span class="kv">overdue=1</span>' in page
