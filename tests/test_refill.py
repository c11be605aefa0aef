"""Refill (docs/design.md, "Refill"): while a batch runs, its free slots are fed by more
claims of its stage instead of waiting for its slowest handler; only where that claim
is the loop's next anyway, never after the budget, and every job it claims is settled
or handed back like the batch's own."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import JobContext, Pipeline, Queue, Quota, Stage
from tests.helpers import enqueue_jobs
from tests.test_poison import POISON, insert_raw

AConn = psycopg.AsyncConnection[Any]


def count_claims(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch,
                 after: Callable[[int], Awaitable[None]] | None = None
                 ) -> list[tuple[str, int, int]]:
    """Record every claim the pipeline makes, as (type, asked, got), in order; ``after``
    is awaited with the claim's number (from 1) once it returned, before its jobs are
    handed over (to hold a claim in flight)."""
    claims: list[tuple[str, int, int]] = []
    real = pipeline.queue.claim

    async def claim(type: str, limit: int, **kw: Any) -> Any:
        jobs = await real(type, limit, **kw)
        claims.append((type, limit, len(jobs)))
        if after is not None:
            await after(len(claims))
        return jobs

    monkeypatch.setattr(pipeline.queue, "claim", claim)
    return claims


def blocking(release: asyncio.Event, starts: list[tuple[int, bool]], blocked: int = 1
             ) -> Callable[[JobContext], Awaitable[None]]:
    """A handler that records (job's i, whether ``release`` was set) as each job starts,
    and whose jobs i < ``blocked`` wait for ``release``."""
    async def handler(ctx: JobContext) -> None:
        starts.append((ctx.job.payload["i"], release.is_set()))
        if ctx.job.payload["i"] < blocked:
            await release.wait()

    return handler


async def until(check: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Wait (in short steps) until ``check()`` holds; whether it did within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.005)
    return True


async def statuses(aconn: AConn, queue: Queue, job_type: str) -> list[tuple[Any, ...]]:
    """(payload i, status, attempts, deferrals) of every job of ``job_type``, by i."""
    cur = await aconn.execute(sql.SQL(
        "SELECT (payload->>'i')::int, status, attempts, deferrals FROM {} WHERE type = %s"
        " ORDER BY 1").format(queue.table("jobs")), [job_type])
    return await cur.fetchall()


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
async def test_free_slots_run_more_jobs_while_a_slow_handler_still_runs(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch, prefetch: bool) -> None:
    """One handler of a batch of 4 blocks; the others return at once: the stage's
    other jobs are claimed and run on the free slots before it is released. With
    prefetch, the batch claimed ahead for the stage feeds the free slots first: no
    second claim runs beside it, and nothing prefetched is left to hand back."""
    release = asyncio.Event()
    starts: list[tuple[int, bool]] = []  # (job's i, whether job 0 was released by then)
    await enqueue_jobs(queue, "t", 9)
    pipeline = Pipeline(queue, [Stage("t", 4, 4, blocking(release, starts),
                                      prefetch=prefetch)])
    claims = count_claims(pipeline, monkeypatch)
    task = asyncio.create_task(pipeline.run())
    await until(lambda: len(starts) == 9)
    release.set()
    result = await task
    assert starts == [(i, False) for i in range(9)]
    # The batch of 4, then for the three free slots (of handlers that return at once)
    # claims of the stage's batch, 4 (with prefetch the first is the prefetched batch);
    # the second comes back short: no more refills. The loop's own claim finds nothing.
    assert claims == [("t", 4, 4), ("t", 4, 4), ("t", 4, 1), ("t", 4, 0)]
    assert (result.stop_reason, result.jobs_done, result.jobs_failed,
            result.jobs_deferred, result.summary) == ("no_work", 9, 0, 0, {})
    assert await statuses(aconn, queue, "t") == [(i, "done", 1, 0) for i in range(9)]
    assert await queue.verify() == []


async def test_without_refill_the_batch_waits_for_its_slowest_handler(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage(refill=False): the batch runs to its end before the next claim."""
    release = asyncio.Event()
    starts: list[tuple[int, bool]] = []  # (job's i, whether job 0 was released by then)
    handler = blocking(release, starts)

    await enqueue_jobs(queue, "t", 6)
    pipeline = Pipeline(queue, [Stage("t", 4, 4, handler, refill=False)])
    claims = count_claims(pipeline, monkeypatch)
    task = asyncio.create_task(pipeline.run())
    await until(lambda: len(starts) == 4)
    await asyncio.sleep(0.1)  # five times the refill's wait: no claim comes
    assert claims == [("t", 4, 4)]
    release.set()
    result = await task
    assert starts == [(0, False), (1, False), (2, False), (3, False), (4, True), (5, True)]
    assert claims == [("t", 4, 4), ("t", 4, 2), ("t", 4, 0)]
    assert (result.stop_reason, result.jobs_done) == ("no_work", 6)
    assert await queue.verify() == []


async def test_refill_stops_at_the_budgets_end_and_hands_back_what_it_claimed(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refill claim that returns after the budget's end starts none of its jobs: they
    go back as they were (pending, attempts and deferrals unchanged), and nothing more
    is claimed while the blocked handler goes on."""
    release = asyncio.Event()
    starts: list[tuple[int, bool]] = []
    handler = blocking(release, starts)

    async def after(n: int) -> None:
        if n == 2:  # the refill claim: it returns past the budget's end
            await asyncio.sleep(0.35)

    await enqueue_jobs(queue, "t", 12)
    pipeline = Pipeline(queue, [Stage("t", 4, 4, handler)])
    claims = count_claims(pipeline, monkeypatch, after)
    task = asyncio.create_task(pipeline.run(time_budget=timedelta(milliseconds=300)))
    await until(lambda: len(claims) == 2)
    await asyncio.sleep(0.5)  # the budget is spent: the blocked handler still runs
    assert not task.done()
    release.set()
    result = await task
    assert starts == [(i, False) for i in range(4)]
    assert claims == [("t", 4, 4), ("t", 4, 4)]
    assert (result.stop_reason, result.jobs_done, result.jobs_failed,
            result.jobs_deferred, result.summary) == ("time_budget", 4, 0, 0,
                                                      {"released": 4})
    assert await statuses(aconn, queue, "t") == (
        [(i, "done", 1, 0) for i in range(4)]
        + [(i, "pending", 0, 0) for i in range(4, 12)])
    cur = await aconn.execute(sql.SQL(
        "SELECT count(*) FROM {} WHERE status = 'pending'"
        " AND (locked_at IS NOT NULL OR claim_token IS NOT NULL)").format(
            queue.table("jobs")))
    assert await cur.fetchone() == (0,)
    assert await queue.verify() == []


async def test_a_later_stage_never_refills_while_an_earlier_one_may_have_work(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Earlier stages win. a, the first stage, refills its batch while a0 blocks; b's
    batch waits for its slow b0 (b's next claim is not the loop's next: a's is), and
    the a jobs its handlers made run before b's next batch."""
    release = {"a": asyncio.Event(), "b": asyncio.Event()}
    starts: list[tuple[str, bool]] = []  # (job, whether its stage's 0 was released)

    async def handler(ctx: JobContext) -> None:
        t, i = ctx.job.type, ctx.job.payload["i"]
        starts.append((f"{t}{i}", release[t].is_set()))
        if i == 0:
            await release[t].wait()
        elif t == "b" and i < 4:
            await ctx.queue.enqueue("a", {"i": 10 + i})

    await enqueue_jobs(queue, "a", 6)
    await enqueue_jobs(queue, "b", 7)
    pipeline = Pipeline(queue, [Stage("a", 4, 4, handler), Stage("b", 4, 4, handler)])
    claims = count_claims(pipeline, monkeypatch)
    task = asyncio.create_task(pipeline.run())
    await until(lambda: len(starts) == 6)
    release["a"].set()
    await until(lambda: len(starts) == 10)
    await asyncio.sleep(0.1)  # five times the refill's wait: no claim of b comes
    assert len(claims) == 4
    release["b"].set()
    result = await task
    assert starts[:10] == ([(f"a{i}", False) for i in range(6)]
                           + [(f"b{i}", False) for i in range(4)])
    assert sorted(starts[10:13]) == [("a11", True), ("a12", True), ("a13", True)]
    assert starts[13:] == [("b4", True), ("b5", True), ("b6", True)]
    assert claims == [("a", 4, 4), ("a", 4, 2), ("a", 4, 0), ("b", 4, 4), ("a", 4, 3),
                      ("a", 4, 0), ("b", 4, 3), ("a", 4, 0), ("b", 4, 0)]
    assert (result.stop_reason, result.jobs_done, result.summary) == ("no_work", 16, {})
    assert await queue.verify() == []


async def test_a_later_stage_refills_once_the_earlier_one_is_skipped(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch) -> None:
    """c, behind the quota-blocked (skipped) b, refills: its claim is the loop's next
    once b is skipped for the run."""
    api = Quota("api", 100, reserve=20)
    await api.spend(queue, 80)  # at its reserve: b is skipped for the run
    release = asyncio.Event()
    starts: list[tuple[str, bool]] = []

    async def handler(ctx: JobContext) -> None:
        starts.append((f"{ctx.job.type}{ctx.job.payload['i']}", release.is_set()))
        if ctx.job.payload["i"] == 0:
            await release.wait()

    await enqueue_jobs(queue, "b", 2)
    await enqueue_jobs(queue, "c", 6)
    pipeline = Pipeline(queue, [Stage("b", 4, 4, handler, quota=api),
                                Stage("c", 4, 4, handler)])
    claims = count_claims(pipeline, monkeypatch)
    task = asyncio.create_task(pipeline.run())
    await until(lambda: len(starts) == 6)
    release.set()
    result = await task
    assert starts == [(f"c{i}", False) for i in range(6)]
    assert claims == [("c", 4, 4), ("c", 4, 2), ("c", 4, 0)]
    assert (result.stop_reason, result.jobs_done, result.summary) == \
        ("quota_reserve", 6, {"postponed": 2})
    assert await queue.verify() == []


async def test_a_row_a_refill_cannot_read_counts_failed_as_in_the_loops_claim(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A refill claim gives an unreadable row up as the loop's claim does (docs/design.md,
    "Bad data belongs to its job"): failed, counted ``unreadable``; the others run."""
    caplog.set_level(logging.CRITICAL, logger="rota.queue")
    release = asyncio.Event()
    starts: list[tuple[int, bool]] = []
    handler = blocking(release, starts)

    await enqueue_jobs(queue, "t", 4)
    poison = await insert_raw(aconn, queue, "t", POISON["long-number"][0])
    for i in (4, 5):
        await queue.enqueue("t", {"i": i})
    pipeline = Pipeline(queue, [Stage("t", 4, 4, handler)])
    claims = count_claims(pipeline, monkeypatch)
    task = asyncio.create_task(pipeline.run())
    assert await until(lambda: len(starts) == 6)  # before job 0 is released
    release.set()
    result = await task
    assert starts == [(i, False) for i in range(6)]
    assert claims == [("t", 4, 4), ("t", 4, 2), ("t", 4, 0)]
    assert (result.stop_reason, result.jobs_done, result.jobs_failed, result.summary) == \
        ("no_work", 6, 1, {"unreadable": 1})
    cur = await aconn.execute(sql.SQL("SELECT status, attempts FROM {} WHERE id = %s")
                              .format(queue.table("jobs")), [poison])
    assert await cur.fetchone() == ("failed", 1)
    assert await queue.verify() == []


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_a_stopped_run_with_a_refill_claim_in_flight_leaves_no_job_running(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Asked to stop (a worker's first SIGTERM: ``stop`` set) or cancelled (the second)
    while a refill claim is in flight: the claim's jobs go back as they were, the
    blocked handler's job is done (stop: it finishes) or back to pending (cancel: its
    attempt failed, as any job the run stopped under), and no job is left running."""
    release = asyncio.Event()
    in_flight = asyncio.Event()
    go_on = asyncio.Event()

    async def handler(ctx: JobContext) -> None:
        if ctx.job.payload["i"] == 0:
            await release.wait()

    async def after(n: int) -> None:
        if n == 2:  # the refill claim, held in flight
            in_flight.set()
            await go_on.wait()

    await enqueue_jobs(queue, "t", 10)
    pipeline = Pipeline(queue, [Stage("t", 4, 4, handler)])
    claims = count_claims(pipeline, monkeypatch, after)
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(trigger="worker", stop=stop))
    await asyncio.wait_for(in_flight.wait(), 5)
    if how == "stop":
        stop.set()
        go_on.set()
        await asyncio.sleep(0.05)
        assert not task.done()  # the blocked handler still runs
        release.set()
        result = await task
        assert (result.stop_reason, result.jobs_done, result.summary) == \
            ("interrupted", 4, {"released": 4})
        expected = [(i, "done", 1, 0) for i in range(4)]
    else:
        task.cancel()
        await asyncio.sleep(0.05)
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        expected = [(0, "pending", 1, 0)] + [(i, "done", 1, 0) for i in range(1, 4)]
    assert claims == [("t", 4, 4), ("t", 4, 4)]
    assert await statuses(aconn, queue, "t") == \
        expected + [(i, "pending", 0, 0) for i in range(4, 10)]
    cur = await aconn.execute(sql.SQL(
        "SELECT count(*) FROM {} WHERE status = 'running' OR locked_at IS NOT NULL"
    ).format(queue.table("jobs")))
    assert await cur.fetchone() == (0,)
    assert await queue.verify() == []


@pytest.mark.parametrize("waits", ["no-op", "yields", "0-6 ms"])
async def test_fast_handlers_are_not_claimed_one_at_a_time(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch,
        waits: str) -> None:
    """200 fast jobs, concurrency 4: each done once, in about as many claims as without
    refill: refill must not make a claim per freed slot (a no-op handler never frees a
    slot while another runs; one that yields to the event loop frees them all at once;
    run times of 0 to 6 ms free them one by one)."""
    seen: list[int] = []

    async def handler(ctx: JobContext) -> None:
        seen.append(ctx.job.id)
        if waits == "yields":
            await asyncio.sleep(0)
        elif waits == "0-6 ms":
            await asyncio.sleep(ctx.job.payload["i"] % 4 * 0.002)

    counts = {}
    for t, refill in (("plain", False), ("filled", True)):
        await queue.enqueue_many([{"type": t, "payload": {"i": i}} for i in range(200)])
        pipeline = Pipeline(queue, [Stage(t, concurrency=4, handler=handler,
                                          refill=refill)])
        claims = count_claims(pipeline, monkeypatch)
        result = await pipeline.run()
        assert (result.stop_reason, result.jobs_done, result.summary) == \
            ("no_work", 200, {})
        assert sum(got for _, _, got in claims) == 200
        counts[t] = len(claims)
        assert await statuses(aconn, queue, t) == [(i, "done", 1, 0) for i in range(200)]
    assert len(seen) == len(set(seen)) == 400
    assert counts["filled"] <= counts["plain"] + 2, counts
    assert await queue.verify() == []


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
async def test_refills_go_on_behind_slow_handlers_in_claims_no_larger_than_the_loops(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch, prefetch: bool) -> None:
    """Two handlers of an auto-sized stage block, 40 others return at once: every other
    job starts before they are released, prefetch or not, and no claim asks for more
    than the stage's claim size (4, its concurrency: no batch has ended to grow it).
    Sized by the fast handlers' pace alone, a refill asked for 80 jobs; taking the
    prefetched batch of 4 then read as a short claim and stopped refilling, so with
    prefetch two slots ran 8 jobs while the rest sat idle."""
    release = asyncio.Event()
    starts: list[tuple[int, bool]] = []
    handler = blocking(release, starts, blocked=2)

    await enqueue_jobs(queue, "t", 42)
    pipeline = Pipeline(queue, [Stage("t", handler=handler, concurrency=4,
                                      prefetch=prefetch)])
    claims = count_claims(pipeline, monkeypatch)
    task = asyncio.create_task(pipeline.run())
    assert await until(lambda: len(starts) == 42)
    release.set()
    result = await task
    assert starts == [(i, False) for i in range(42)]
    # The batch and its refills, 4 each (the last one short), then the loop's own
    # claim, sized by the batch that ended (grown: its handlers were fast), finds none.
    *batch, last = claims
    assert [asked for _, asked, _ in batch] == [4] * len(batch)
    assert [got for _, _, got in batch] == [4] * 10 + [2] and last[2] == 0
    assert (result.stop_reason, result.jobs_done, result.summary) == ("no_work", 42, {})
    assert await statuses(aconn, queue, "t") == [(i, "done", 1, 0) for i in range(42)]
    assert await queue.verify() == []


async def test_a_refilled_batch_saves_the_runs_progress_while_it_runs(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refilled batch may last the whole run: its runs row's counters are saved as it
    goes (every SAVE_EVERY_S), not only at its end. One handler blocks; once the other
    30 jobs are done, the row says 30 done while that handler still runs (before, it
    said 0 until the batch ended)."""
    from rota.runner import recording

    monkeypatch.setattr(recording, "SAVE_EVERY_S", 0.05)
    release = asyncio.Event()

    async def handler(ctx: JobContext) -> None:
        if ctx.job.payload["i"] == 0:
            await release.wait()

    await enqueue_jobs(queue, "t", 31)
    pipeline = Pipeline(queue, [Stage("t", handler=handler, concurrency=4)])
    task = asyncio.create_task(pipeline.run())
    saved: list[int] = []

    async def jobs_done() -> int:
        cur = await aconn.execute(sql.SQL("SELECT coalesce(max(jobs_done), -1) FROM {}")
                                  .format(queue.table("runs")))
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not saved or saved[-1] != 30):
        saved.append(await jobs_done())
        await asyncio.sleep(0.02)
    assert saved[-1] == 30 and not task.done()
    release.set()
    result = await task
    assert (result.stop_reason, result.jobs_done) == ("no_work", 31)
    assert await jobs_done() == 31
    assert await queue.verify() == []


async def test_handlers_all_slower_than_the_wait_are_not_refilled_a_few_at_a_time(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every handler takes 20-35 ms, as on a machine so loaded that none finishes
    within the refill's 20 ms: none is slow against the others (4 times their mean), so
    the batches end as they would without refill and the loop's claims grow: as many
    claims as without refill, one more at most. With the 20 ms alone (STRAGGLER 0) each
    batch was refilled four jobs at a time: 12 claims against 5."""
    async def handler(ctx: JobContext) -> None:
        await asyncio.sleep(0.02 + ctx.job.payload["i"] % 4 * 0.005)

    counts = {}
    for t, refill in (("plain", False), ("filled", True)):
        await enqueue_jobs(queue, t, 40)
        pipeline = Pipeline(queue, [Stage(t, concurrency=4, handler=handler,
                                          refill=refill)])
        claims = count_claims(pipeline, monkeypatch)
        result = await pipeline.run()
        assert (result.stop_reason, result.jobs_done) == ("no_work", 40)
        counts[t] = len(claims)
    assert counts["filled"] <= counts["plain"] + 1, counts
    assert await queue.verify() == []
