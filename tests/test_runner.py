"""The pipeline runner: loop order, budget, stop reasons, the runs row, heartbeats."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from rota import (
    Allowance,
    ConfigError,
    DeferJob,
    InvalidInput,
    Job,
    JobContext,
    NaiveDatetimeError,
    Pipeline,
    Plan,
    Plans,
    Queue,
    Quota,
    RunResult,
    Stage,
)
from tests.helpers import enqueue_jobs

AConn = psycopg.AsyncConnection[Any]


async def run_row(aconn: AConn, queue: Queue, result: RunResult) -> dict[str, Any]:
    cur = aconn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {} WHERE id = %s").format(queue.table("runs")),
                      [result.run_id])
    row = await cur.fetchone()
    assert row is not None
    return row


async def job(queue: Queue, job_id: int) -> Job:
    j = await queue.get_job(job_id)
    assert j is not None
    return j


# -- the loop ---------------------------------------------------------------------------


async def test_earlier_stages_win_and_the_loop_restarts_from_the_top(queue: Queue) -> None:
    """b runs before c; each c job makes an a job, which runs before the next c."""
    order: list[str] = []

    async def a(ctx: JobContext) -> None:
        order.append(f"a{ctx.job.payload['i']}")

    async def b(ctx: JobContext) -> None:
        order.append(f"b{ctx.job.payload['i']}")

    async def c(ctx: JobContext) -> None:
        order.append(f"c{ctx.job.payload['i']}")
        await ctx.queue.enqueue("a", {"i": ctx.job.payload["i"]})

    pipeline = Pipeline(queue, [Stage("a", 1, 1, a), Stage("b", 1, 1, b),
                                Stage("c", 1, 1, c)])
    await enqueue_jobs(queue, "c", 2)
    await enqueue_jobs(queue, "b", 2)
    result = await pipeline.run(trigger="manual")
    assert order == ["b0", "b1", "c0", "a0", "c1", "a1"]
    assert (result.stop_reason, result.jobs_done, result.jobs_failed,
            result.jobs_deferred) == ("no_work", 6, 0, 0)


async def test_a_stage_runs_at_most_concurrency_jobs_at_a_time(queue: Queue) -> None:
    in_flight = 0
    peak = 0

    async def handler(ctx: JobContext) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.02)
        in_flight -= 1

    await enqueue_jobs(queue, "work", 7)
    result = await Pipeline(queue, [Stage("work", 5, 2, handler)]).run()
    assert peak == 2
    assert (result.stop_reason, result.jobs_done) == ("no_work", 7)


async def test_budget_stop_finishes_in_flight_and_releases_unstarted(queue: Queue) -> None:
    """After the budget no batch is claimed, what is in flight finishes, and claimed jobs
    not yet started go back as they were: attempt handed back, no deferral counted
    (docs/design.md, "Defer")."""
    started: list[int] = []

    async def slow(ctx: JobContext) -> None:
        assert ctx.time_left() > timedelta(0)
        started.append(ctx.job.id)
        await asyncio.sleep(0.35)  # outlives the budget
        ctx.count("finished")

    ids = await enqueue_jobs(queue, "slow", 6)
    pipeline = Pipeline(queue, [Stage("slow", 4, 2, slow)])
    result = await pipeline.run(trigger="cli", time_budget=timedelta(milliseconds=200))

    assert (result.stop_reason, result.jobs_done, result.jobs_deferred) == ("time_budget", 2, 0)
    assert result.summary == {"finished": 2, "released": 2}
    assert started == ids[:2]
    for i in ids[:2]:
        assert (await job(queue, i)).status == "done"
    for i in ids[2:4]:  # claimed, never started
        j = await job(queue, i)
        assert (j.status, j.attempts, j.deferrals, j.locked_at) == ("pending", 0, 0, None)
        assert j.run_after <= await queue.now()
    for i in ids[4:]:  # never claimed: no second batch after the budget
        j = await job(queue, i)
        assert (j.status, j.attempts, j.deferrals, j.run_id) == ("pending", 0, 0, None)


async def test_handler_errors_retry_with_backoff_then_give_up_once(queue: Queue) -> None:
    refunds: list[int] = []

    async def boom(ctx: JobContext) -> None:
        raise ValueError("the API said no")

    async def refund(j: Job, conn: AConn) -> None:
        refunds.append(j.id)

    pipeline = Pipeline(queue, [Stage("draft", 5, 1, boom, max_attempts=2,
                                      on_give_up=refund)])
    # Through the pipeline's queue: the stage's max_attempts, 2.
    [jid] = await enqueue_jobs(pipeline.queue, "draft", 1)
    first = await pipeline.run()
    assert (first.jobs_done, first.jobs_failed, first.summary) == (0, 0, {"retries": 1})
    j = await job(queue, jid)
    assert (j.status, j.attempts, j.max_attempts) == ("pending", 1, 2)
    assert j.last_error == "ValueError: the API said no"
    assert (await pipeline.run()).stop_reason == "no_work"  # backing off (2 minutes)

    queue.clock_offset = timedelta(minutes=3)
    second = await pipeline.run()
    assert (second.jobs_failed, second.summary) == (1, {})
    assert (await job(queue, jid)).status == "failed"
    assert refunds == [jid]


async def test_defer_job_puts_it_back_without_burning_an_attempt(queue: Queue) -> None:
    async def not_now(ctx: JobContext) -> None:
        raise DeferJob(await ctx.queue.now() + timedelta(hours=1))

    [jid] = await enqueue_jobs(queue, "wait", 1)
    pipeline = Pipeline(queue, [Stage("wait", 1, 1, not_now)])
    for _ in range(3):
        result = await pipeline.run()
        assert (result.stop_reason, result.jobs_deferred) == ("no_work", 1)
        assert (await pipeline.run()).jobs_deferred == 0  # not due yet
        queue.clock_offset += timedelta(hours=1, seconds=1)
    j = await job(queue, jid)
    assert (j.status, j.attempts, j.deferrals) == ("pending", 0, 3)


async def test_a_run_never_runs_a_job_it_deferred(queue: Queue) -> None:
    """DeferJob() (due as soon as possible) is due when this run's budget ends while the
    run goes on, or the run would claim it again and again; once the run has ended
    (here at once: nothing else to do), it is due at once again, not 60 s later."""
    calls = 0

    async def again(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        raise DeferJob()

    [jid] = await enqueue_jobs(queue, "again", 1)
    before = await queue.now()
    result = await Pipeline(queue, [Stage("again", 1, 1, again)]).run(
        time_budget=timedelta(seconds=60))
    after = await queue.now()
    assert (result.stop_reason, result.jobs_deferred, calls) == ("no_work", 1, 1)
    j = await job(queue, jid)
    assert (j.status, j.attempts, j.deferrals) == ("pending", 0, 1)
    assert before < j.run_after < after


async def test_a_deferral_by_a_timedelta_is_due_that_long_after_it(queue: Queue) -> None:
    """DeferJob(timedelta) counts from the queue's clock at the deferral, and the due
    time is kept exactly once the run ends (it was pushed to the budget's end while the
    run went on)."""
    deferred_at: list[Any] = []

    async def later(ctx: JobContext) -> None:
        deferred_at.append(await ctx.queue.now())
        raise DeferJob(timedelta(seconds=30))

    [jid] = await enqueue_jobs(queue, "later", 1)
    result = await Pipeline(queue, [Stage("later", 1, 1, later)]).run(
        time_budget=timedelta(seconds=120))
    assert (result.stop_reason, result.jobs_deferred) == ("no_work", 1)
    j = await job(queue, jid)
    [at] = deferred_at
    # The handler's clock read and the deferral's are two round trips apart.
    assert timedelta(seconds=30) <= j.run_after - at < timedelta(seconds=30.5)
    assert (j.status, j.attempts, j.deferrals) == ("pending", 0, 1)


@pytest.mark.parametrize("until", [timedelta(seconds=-1), "30s", 30])
def test_a_deferral_refuses_a_negative_timedelta_or_another_type(until: Any) -> None:
    with pytest.raises(InvalidInput, match="until must"):
        DeferJob(until)


async def test_restoring_due_times_leaves_a_job_claimed_or_moved_since_alone(
    queue: Queue,
) -> None:
    """The fence of Queue.restore_due_times: the pushed due time and the claim token."""
    a, b, c = await enqueue_jobs(queue, "t", 3)
    claimed = {j.id: j for j in await queue.claim("t", 3)}
    now = await queue.now()
    pushed, asked = now + timedelta(minutes=5), now + timedelta(seconds=10)
    for j in claimed.values():
        assert await queue.defer(j, pushed) == 1
    # a is claimed again since (a new claim token, the oldest first); c is moved by
    # an operator.
    async with queue.connection() as conn:
        await conn.execute(sql.SQL("UPDATE {}.jobs SET run_after = run_after - "
                                   "interval '1 minute' WHERE id = %s").format(
                                       sql.Identifier(queue.schema)), [c])
    queue.clock_offset = timedelta(minutes=6)
    [reclaimed] = await queue.claim("t", 1)
    assert reclaimed.id == a
    queue.clock_offset = timedelta(0)
    n = await queue.restore_due_times([(i, claimed[i].claim_token, pushed, asked)
                                       for i in (a, b, c)])
    assert n == 1
    assert [(await job(queue, i)).run_after for i in (b, c)] == [
        asked, pushed - timedelta(minutes=1)]
    assert (await job(queue, a)).status == "running"


async def test_restoring_due_times_locks_its_rows_in_id_order(
    queue: Queue, database_url: str,
) -> None:
    """Like every statement that locks several jobs (docs/design.md, "Defer"; the
    fenced batch transitions), the restore locks them in id order whatever order the
    run pushed them in, so it cannot deadlock with a sweeper: while another
    transaction holds job a, the restore of (b, a) waits for a holding nothing, and b
    can be locked at once."""
    a, b = await enqueue_jobs(queue, "t", 2)
    claimed = {j.id: j for j in await queue.claim("t", 2)}
    now = await queue.now()
    # b was pushed first, a moment earlier: neither the pushed order, nor the index
    # on due times, nor a's newer row version reaches a first by accident.
    pushed = {b: now + timedelta(minutes=5), a: now + timedelta(minutes=5, seconds=1)}
    for i, j in claimed.items():
        assert await queue.defer(j, pushed[i]) == 1
    jobs = queue.table("jobs")
    async with await psycopg.AsyncConnection.connect(database_url) as other:
        await other.execute(sql.SQL("SELECT 1 FROM {} WHERE id = %s FOR UPDATE")
                            .format(jobs), [a])
        restore = asyncio.create_task(queue.restore_due_times(
            [(i, claimed[i].claim_token, pushed[i], None) for i in (b, a)]))
        me = other.info.backend_pid
        async with asyncio.timeout(10):
            while True:  # until the restore waits for a
                cur = await other.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE %s = ANY(pg_blocking_pids(pid))", [me])
                row = await cur.fetchone()
                if row is not None and row[0] == 1:
                    break
                await asyncio.sleep(0.02)
        cur = await other.execute(sql.SQL("SELECT id FROM {} WHERE id = %s "
                                          "FOR UPDATE NOWAIT").format(jobs), [b])
        assert await cur.fetchall() == [(b,)]
        await other.commit()
    assert await restore == 2
    after = await queue.now()
    for i in (a, b):
        assert now < (await job(queue, i)).run_after <= after


@pytest.mark.parametrize(("item", "error", "message"), [
    ((1, None, datetime(2030, 1, 1), None), NaiveDatetimeError,
     "pushed=2030-01-01T00:00:00 has no time zone; pass an aware datetime"),
    ((1, None, datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 1)),
     NaiveDatetimeError, "asked=2030-01-01T00:00:00 has no time zone; pass an aware datetime"),
    ((True, None, datetime(2030, 1, 1, tzinfo=UTC), None), InvalidInput,
     "job_id must be an int between 1 and 9223372036854775807, got True"),
    ((2**63, None, datetime(2030, 1, 1, tzinfo=UTC), None), InvalidInput,
     "job_id must be an int between 1 and 9223372036854775807, got 9223372036854775808"),
    ((1, "x", datetime(2030, 1, 1, tzinfo=UTC), None), InvalidInput,
     "claim token of job 1 must be a UUID or None, got str"),
])
async def test_restoring_due_times_refuses_bad_input_in_one_line(
    queue: Queue, item: Any, error: type[Exception], message: str,
) -> None:
    """A naive due time is an error, not a guess in the session's time zone; a bad id
    or token is refused before the database sees it (docs/design.md, "Bad input")."""
    with pytest.raises(error) as raised:
        await queue.restore_due_times([item])
    assert str(raised.value).startswith(message), str(raised.value)


async def test_batch_handler_settles_each_job_on_its_own(queue: Queue) -> None:
    calls: list[int] = []

    async def enrich(ctxs: list[JobContext]) -> None:
        calls.append(len(ctxs))
        await ctxs[0].fail("channel gone")
        await ctxs[1].defer()
        await ctxs[2].complete()
        for c in ctxs:
            c.count("channels_enriched")

    ids = await enqueue_jobs(queue, "enrich", 5)
    result = await Pipeline(queue, [Stage("enrich", 25, 1, batch_handler=enrich)]).run()
    assert calls == [5]
    assert (result.jobs_done, result.jobs_deferred, result.jobs_failed) == (3, 1, 0)
    assert result.summary == {"channels_enriched": 5, "retries": 1}
    statuses = [(await job(queue, i)) for i in ids]
    assert [(j.status, j.attempts) for j in statuses] == \
        [("pending", 1), ("pending", 0)] + [("done", 1)] * 3


async def test_a_batch_handler_that_raises_fails_its_unsettled_jobs(queue: Queue) -> None:
    async def enrich(ctxs: list[JobContext]) -> None:
        await ctxs[0].complete()
        raise RuntimeError("timeout")

    ids = await enqueue_jobs(queue, "enrich", 3)
    result = await Pipeline(queue, [Stage("enrich", 25, 1, batch_handler=enrich)]).run()
    assert (result.jobs_done, result.summary) == (1, {"retries": 2})
    assert [(await job(queue, i)).last_error for i in ids[1:]] == ["RuntimeError: timeout"] * 2


# -- the runs row -----------------------------------------------------------------------


async def test_the_run_row_is_written_at_start_and_completed_at_end(
        queue: Queue, aconn: AConn) -> None:
    seen: list[dict[str, Any]] = []

    async def handler(ctx: JobContext) -> None:
        cur = aconn.cursor(row_factory=dict_row)
        await cur.execute(sql.SQL("SELECT * FROM {} WHERE id = %s")
                          .format(queue.table("runs")), [ctx.run_id])
        row = await cur.fetchone()
        assert row is not None
        seen.append(row)
        ctx.count("drafts_written")
        ctx.count("tokens", 1.5)

    await enqueue_jobs(queue, "draft", 2)
    result = await Pipeline(queue, [Stage("draft", 1, 1, handler)]).run(trigger="worker")
    assert [(r["trigger"], r["stop_reason"], r["finished_at"]) for r in seen] == \
        [("worker", None, None)] * 2
    assert seen[1]["jobs_done"] == 1  # progress saved after each batch
    row = await run_row(aconn, queue, result)
    assert row["stop_reason"] == "no_work" and row["error"] is None
    assert (row["jobs_done"], row["jobs_failed"], row["jobs_deferred"],
            row["quota_units"]) == (2, 0, 0, 0)
    assert row["summary"] == {"drafts_written": 2, "tokens": 3.0} == result.summary
    assert row["started_at"] == result.started_at <= result.finished_at == row["finished_at"]
    j = await job(queue, (await enqueue_jobs(queue, "draft", 1))[0])
    assert j.run_id is None


async def test_no_transaction_is_open_while_a_handler_runs(queue: Queue,
                                                           database_url: str) -> None:
    """Any transaction held open across the handler would hold a lock for as long as the
    handler runs, so LOCK … NOWAIT would fail on every try. Short statements may still be
    in flight when the handler starts (the previous job's batched completion, the
    claim's background upkeep), so a few tries a few milliseconds apart are allowed."""
    async def handler(ctx: JobContext) -> None:
        await queue.run_upkeep()
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as conn:
            for attempt in range(40):
                try:
                    async with conn.transaction():
                        await conn.execute(
                            sql.SQL("LOCK TABLE {}, {} IN ACCESS EXCLUSIVE MODE NOWAIT")
                            .format(queue.table("jobs"), queue.table("runs")))
                    return
                except psycopg.errors.LockNotAvailable:
                    if attempt == 39:
                        raise
                    await asyncio.sleep(0.025)

    await enqueue_jobs(queue, "t", 3)
    result = await Pipeline(queue, [Stage("t", 3, 1, handler)]).run()
    assert (result.jobs_done, result.jobs_failed, result.summary) == (3, 0, {})


# -- the five stop reasons --------------------------------------------------------------


async def test_stop_reason_no_work(queue: Queue, aconn: AConn) -> None:
    async def handler(ctx: JobContext) -> None:
        pass

    result = await Pipeline(queue, [Stage("x", 1, 1, handler)]).run()
    assert (result.stop_reason, result.jobs_done, result.error) == ("no_work", 0, None)
    assert (await run_row(aconn, queue, result))["stop_reason"] == "no_work"


async def test_stop_reason_time_budget(queue: Queue) -> None:
    async def handler(ctx: JobContext) -> None:
        await asyncio.sleep(0.3)

    await enqueue_jobs(queue, "x", 10)
    result = await Pipeline(queue, [Stage("x", 1, 1, handler)]).run(
        time_budget=timedelta(milliseconds=200))
    assert result.stop_reason == "time_budget"
    assert result.jobs_done == 1 and result.jobs_deferred == 0


async def test_stop_reason_quota_reserve(queue: Queue, aconn: AConn) -> None:
    """A stage whose quota is at its reserve is skipped; its jobs wait for the reset;
    the other stages still run."""
    api = Quota("api", 100, reserve=20, reset_tz="America/Los_Angeles")
    await api.spend(queue, 80)
    ran: list[str] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.job.type)

    search = await enqueue_jobs(queue, "search", 3)
    await enqueue_jobs(queue, "score", 1)
    pipeline = Pipeline(queue, [Stage("score", 1, 1, handler),
                                Stage("search", 1, 1, handler, quota=api)])
    result = await pipeline.run()
    assert ran == ["score"]
    assert (result.stop_reason, result.jobs_done) == ("quota_reserve", 1)
    assert result.summary == {"postponed": 3}
    reset = api.next_reset(await queue.now())
    for i in search:
        j = await job(queue, i)
        assert (j.status, j.attempts, j.deferrals, j.run_after) == ("pending", 0, 0, reset)
    # The next run finds the same work still waiting for the quota.
    assert (await pipeline.run()).stop_reason == "quota_reserve"
    # After the reset the work proceeds.
    queue.clock_offset = reset - (await queue.now() - queue.clock_offset) + timedelta(seconds=1)
    after = await pipeline.run()
    assert (after.stop_reason, after.jobs_done) == ("no_work", 3)


async def test_a_dead_runs_stale_job_of_a_quota_blocked_stage_waits_for_the_reset(
    queue: Queue, aconn: AConn
) -> None:
    """The demo's failure: a run dies holding a search job; by the time its lock goes
    stale, the searches have used the quota down to its reserve, so every later run skips
    the search stage and never claims it again. The job must not stay `running` with a
    dead lock until the reset: it waits for the reset as pending, its lost attempt
    counted, and the dead claim fenced."""
    api = Quota("api", 1000, reserve=100, reset_tz="America/Los_Angeles")
    ran: list[int] = []

    async def handler(ctx: JobContext) -> None:
        ran.append(ctx.job.id)

    [stuck] = await enqueue_jobs(queue, "search", 1, max_attempts=1)  # no attempt left
    search = await enqueue_jobs(queue, "search", 3)
    claimed = await queue.claim("search", 2)  # by the run that dies
    assert [j.id for j in claimed] == [stuck, search[0]]
    held = claimed[1]
    queue.clock_offset = queue.stale_after + timedelta(seconds=1)  # locks go stale
    await api.spend(queue, 850)  # the other runs' searches: down to the reserve
    pipeline = Pipeline(queue, [Stage("search", 1, 1, handler, quota=api, quota_cost=100)])
    result = await pipeline.run()
    assert ran == []
    assert result.stop_reason == "quota_reserve"
    reset = api.next_reset(await queue.now())
    j = await job(queue, held.id)
    assert (j.status, j.attempts, j.deferrals, j.run_after, j.locked_at, j.claim_token) == (
        "pending", 1, 0, reset, None, None)
    assert await queue.complete(held) is False  # the dead run's claim is fenced
    assert result.summary == {"postponed": 3}
    # The job with no attempt left stays running, for fail_stuck_jobs.
    assert (await job(queue, stuck)).status == "running"
    assert [j.id for j in await queue.fail_stuck_jobs()] == [stuck]
    # After the reset the work proceeds, the reclaimed job first (oldest).
    queue.clock_offset = reset - (await queue.now() - queue.clock_offset) + timedelta(seconds=1)
    after = await pipeline.run()
    assert (after.stop_reason, after.jobs_done) == ("no_work", 3)
    assert ran == [held.id, *search[1:]]


async def test_stop_reason_quota_exhausted(queue: Queue, aconn: AConn) -> None:
    """Handlers spend 100 units of 250: two searches run, the third cannot get its units
    and is deferred to the reset; the claimed one behind it goes back as it was and
    waits for the reset too (postponed, no deferral counted)."""
    api = Quota("api", 250, reset_tz="America/Los_Angeles")

    async def search(ctx: JobContext) -> None:
        await ctx.spend(api, 100)
        ctx.count("searches")

    ids = await enqueue_jobs(queue, "search", 5)
    pipeline = Pipeline(queue, [Stage("search", 4, 1, search, quota=api, quota_cost=1)])
    result = await pipeline.run()
    assert (result.stop_reason, result.jobs_done, result.jobs_deferred,
            result.quota_units) == ("quota_exhausted", 2, 1, 200)
    assert result.summary == {"searches": 2, "quota.api": 200, "quota_deferred": 1,
                              "released": 1, "postponed": 2}
    reset = api.next_reset(await queue.now())
    for i in ids[2:]:
        j = await job(queue, i)
        assert (j.status, j.attempts, j.run_after) == ("pending", 0, reset)
    row = await run_row(aconn, queue, result)
    assert (row["stop_reason"], row["quota_units"]) == ("quota_exhausted", 200)
    assert (await api.usage(queue)).used == 200


async def test_stop_reason_error_records_the_error(queue: Queue, aconn: AConn) -> None:
    """The database refuses the runner's write: the run ends in error, its row says why,
    and the job it held goes back to be retried."""
    jobs = queue.table("jobs")

    async def handler(ctx: JobContext) -> None:
        # Possible only because no transaction of the runner is open on jobs now.
        await aconn.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT never_done "
                                    "CHECK (status <> 'done') NOT VALID").format(jobs))

    [jid] = await enqueue_jobs(queue, "x", 1)
    result = await Pipeline(queue, [Stage("x", 1, 1, handler)]).run()
    assert result.stop_reason == "error"
    assert result.error is not None and result.error.startswith("CheckViolation")
    row = await run_row(aconn, queue, result)
    assert (row["stop_reason"], row["error"]) == ("error", result.error)
    assert row["finished_at"] is not None
    j = await job(queue, jid)
    assert (j.status, j.attempts) == ("pending", 1)
    assert j.last_error == "the run stopped while the job was running"


# -- allowances, cancellation, heartbeats, configuration --------------------------------


async def test_an_owner_out_of_allowance_waits_for_the_reset(make_queue: Any) -> None:
    plans = Plans([Plan("free", "Free", 0, {"searches_per_day": 2}),
                   Plan("pro", "Pro", 1, {"searches_per_day": 10})])
    queue: Queue = await make_queue(plans=plans)
    await queue.upsert_group("small", plan="free", owner_id="alice")
    await queue.upsert_group("big", plan="pro", owner_id="bob")
    searches = Allowance("searches", "searches_per_day")

    async def search(ctx: JobContext) -> None:
        await ctx.spend("searches")

    alice = await enqueue_jobs(queue, "search", 3, group_id="small")
    await enqueue_jobs(queue, "search", 3, group_id="big")
    pipeline = Pipeline(queue, [Stage("search", 1, 1, search)], quotas=[searches])
    result = await pipeline.run()
    # One owner's allowance is not the run's resource: the run simply has no more work.
    assert (result.stop_reason, result.jobs_done, result.jobs_deferred) == ("no_work", 5, 1)
    assert result.summary == {"allowance.searches": 5, "quota_deferred": 1}
    statuses = [(await job(queue, i)).status for i in alice]
    assert sorted(statuses) == ["done", "done", "pending"]


async def test_a_cancelled_run_records_its_end_and_hands_back_its_jobs(
        queue: Queue, aconn: AConn) -> None:
    started = asyncio.Event()

    async def forever(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(3600)

    ids = await enqueue_jobs(queue, "x", 2)
    task = asyncio.create_task(Pipeline(queue, [Stage("x", 2, 1, forever)]).run())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    cur = aconn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {}").format(queue.table("runs")))
    [row] = await cur.fetchall()
    assert (row["stop_reason"], row["error"], row["jobs_deferred"]) == ("error", "cancelled", 0)
    assert row["summary"] == {"released": 1, "retries": 1}
    first, second = await job(queue, ids[0]), await job(queue, ids[1])
    assert (first.status, first.attempts, first.last_error) == \
        ("pending", 1, "the run stopped while the job was running")
    assert (second.status, second.attempts, second.deferrals) == ("pending", 0, 0)


async def test_a_cancelled_run_makes_what_it_deferred_due_as_asked_again(
        queue: Queue) -> None:
    """A run cancelled (a second stop request) ends sooner than its budget too: the
    job it deferred with DeferJob() is due now again, not at the end of the budget
    it was pushed to (docs/design.md, "Defer")."""
    started = asyncio.Event()

    async def defer_then_hang(ctx: JobContext) -> None:
        if ctx.job.payload["i"] == 0:
            raise DeferJob()
        started.set()
        await asyncio.sleep(3600)

    deferred, _ = await enqueue_jobs(queue, "x", 2)
    task = asyncio.create_task(Pipeline(queue, [Stage("x", 1, 1, defer_then_hang)]).run(
        time_budget=timedelta(seconds=120)))
    await started.wait()
    before = await queue.now()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    j = await job(queue, deferred)
    assert (j.status, j.attempts, j.deferrals) == ("pending", 0, 1)
    assert before < j.run_after < await queue.now()


async def test_heartbeat_keeps_a_live_runs_jobs_from_looking_stale(make_queue: Any) -> None:
    queue: Queue = await make_queue()
    other: Queue = await make_queue()
    started = asyncio.Event()
    release = asyncio.Event()

    async def long_job(ctx: JobContext) -> None:
        started.set()
        await release.wait()

    [jid] = await enqueue_jobs(queue, "long", 1)
    pipeline = Pipeline(queue, [Stage("long", 1, 1, long_job)],
                        heartbeat_every=timedelta(milliseconds=20))
    task = asyncio.create_task(pipeline.run(trigger="worker"))
    await started.wait()
    claimed_at = (await job(queue, jid)).locked_at
    assert claimed_at is not None
    queue.clock_offset = timedelta(minutes=14)
    for _ in range(500):  # a few heartbeats: at most a few tenths of a second
        locked = (await job(queue, jid)).locked_at
        if locked is not None and locked >= claimed_at + timedelta(minutes=14):
            break
        await asyncio.sleep(0.01)
    else:
        pytest.fail("no heartbeat refreshed the lock")
    # 20 minutes after the claim, the lock is 6 minutes old: not stale, not reclaimed.
    other.clock_offset = timedelta(minutes=20)
    assert await other.claim("long", 1) == []
    release.set()
    result = await task
    assert result.jobs_done == 1 and result.summary == {}


async def test_a_heartbeat_that_swallows_its_cancellation_does_not_hold_the_runs_end(
        queue: Queue, aconn: AConn) -> None:
    """On Python 3.11, ``asyncio.wait_for`` (psycopg_pool waits for a connection
    through it) drops a cancellation that lands as its result arrives: a beat cancelled
    just as the pool handed it a connection went on beating, and the run, awaiting it,
    never recorded its end (the multi-host chaos run: a worker stopped after a cut link
    and a restart hung until its platform timeout, exited 1, and its run was later
    marked killed). Here the beat drops the cancellation the same way."""
    in_beat = asyncio.Event()
    swallowed = 0
    beat = queue.heartbeat

    async def heartbeat(jobs: Any) -> Any:
        nonlocal swallowed
        if in_beat.is_set():
            return await beat(jobs)
        in_beat.set()
        try:
            await asyncio.sleep(3600)  # the pool's wait for a connection
        except asyncio.CancelledError:
            swallowed += 1  # what wait_for does when the connection came with it
        return await beat(jobs)

    queue.heartbeat = heartbeat  # type: ignore[method-assign]

    async def handler(ctx: JobContext) -> None:
        await in_beat.wait()

    await enqueue_jobs(queue, "t", 1)
    pipeline = Pipeline(queue, [Stage("t", 1, 1, handler)],
                        heartbeat_every=timedelta(milliseconds=20))
    # Bounded only so that the bug fails the test instead of hanging it.
    result = await asyncio.wait_for(pipeline.run(trigger="manual"), 30)
    assert swallowed == 1
    assert (result.stop_reason, result.jobs_done, result.error) == ("no_work", 1, None)
    row = await run_row(aconn, queue, result)
    assert (row["stop_reason"], row["finished_at"]) == ("no_work", result.finished_at)


async def test_settings_that_would_let_a_live_job_look_stale_are_refused(
        make_queue: Any) -> None:
    async def handler(ctx: JobContext) -> None:
        pass

    stage = Stage("x", 1, 1, handler)
    short: Queue = await make_queue(stale_after=timedelta(minutes=5))
    with pytest.raises(ConfigError, match="stale window"):
        Pipeline(short, [stage])  # platform timeout 300 s == stale window
    Pipeline(short, [stage], platform_timeout=timedelta(seconds=299))
    queue: Queue = await make_queue()
    pipeline = Pipeline(queue, [stage])
    with pytest.raises(ConfigError, match="time_budget"):
        await pipeline.run(time_budget=timedelta(seconds=300))
    with pytest.raises(InvalidInput, match="trigger"):
        await pipeline.run(trigger="nightly")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="heartbeat"):
        Pipeline(queue, [stage], heartbeat_every=timedelta(seconds=200))
    with pytest.raises(ConfigError, match="duplicate"):
        Pipeline(queue, [stage, stage])
    with pytest.raises(InvalidInput, match="exactly one"):
        Stage("x", 1, 1)
    with pytest.raises(InvalidInput, match="batch"):
        Stage("x", 0, 1, handler)
    with pytest.raises(ConfigError, match="unknown quota"):
        pipeline.quota("nope")


async def test_a_run_cut_off_by_dropped_connections_records_its_error(
        database_url: str, schema: str, aconn: AConn) -> None:
    """What a database restart does mid-run, on a caller's pool with no connection
    check: every session is terminated while a handler runs, so the runner's next
    statements fail one after another. The run still records its end ("error") once a
    fresh connection answers, instead of raising and being marked "killed" later. The
    completion of the job that ran is sent again on a fresh connection (docs/design.md,
    "Settling twice"), so the job is done and the next run finds nothing to do."""
    app = f"rota-test-{schema}"
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        make_conninfo(database_url, application_name=app), min_size=4, max_size=4,
        open=False, kwargs={"autocommit": True})
    await pool.open(wait=True)
    calls = 0

    async def handler(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # the runner holds no connection now: all four are idle
            cur = await aconn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) "
                "FROM pg_stat_activity WHERE application_name = %s", [app])
            assert (await cur.fetchone())[0] == 4

    try:
        queue = Queue(pool, schema=schema)
        await queue.migrate()
        [jid] = await enqueue_jobs(queue, "x", 1)
        pipeline = Pipeline(queue, [Stage("x", 1, 1, handler)])
        cut = await pipeline.run(trigger="worker")
        assert cut.stop_reason == "error"
        # The claim is the first statement to meet a dead session. It is pipelined (one
        # round trip), and a pipeline does not read the server's last word on a closed
        # connection, only that it closed.
        assert cut.error == ("OperationalError: consuming input failed: server closed the "
                             "connection unexpectedly\n\tThis probably means the server "
                             "terminated abnormally\n\tbefore or while processing the "
                             "request.")
        row = await run_row(aconn, queue, cut)
        assert (row["stop_reason"], row["error"]) == ("error", cut.error)
        assert row["finished_at"] == cut.finished_at
        assert cut.jobs_done == 1
        j = await job(queue, jid)  # completed on a fresh connection
        assert (j.status, j.attempts, j.run_id) == ("done", 1, cut.run_id)
        queue.clock_offset = timedelta(minutes=16)
        after = await pipeline.run(trigger="worker")
        assert (after.stop_reason, after.jobs_done, calls) == ("no_work", 0, 1)
    finally:
        await pool.close()


async def test_a_stage_without_a_hook_owes_no_give_up(queue: Queue, aconn: AConn) -> None:
    ran: list[int] = []

    async def refund(j: Job, conn: Any) -> None:
        ran.append(j.id)

    async def boom(ctx: JobContext) -> None:
        raise RuntimeError("no luck")

    pipeline = Pipeline(queue, [Stage("plain", 5, 1, boom, max_attempts=1),
                                Stage("paid", 5, 1, boom, max_attempts=1, on_give_up=refund)])
    [plain] = await enqueue_jobs(pipeline.queue, "plain", 1)
    [paid] = await enqueue_jobs(pipeline.queue, "paid", 1)
    result = await pipeline.run(trigger="manual", time_budget=timedelta(seconds=30))
    assert (result.stop_reason, result.jobs_failed) == ("no_work", 2)
    assert ran == [paid]
    cur = await aconn.execute(sql.SQL("SELECT id, status, give_up_pending FROM {} ORDER BY id")
                              .format(queue.table("jobs")))
    assert await cur.fetchall() == [(plain, "failed", False), (paid, "failed", False)]


# -- prefetch ---------------------------------------------------------------------------

async def _fair_backlog(queue: Queue, job_type: str) -> None:
    """Three groups of unequal size (9, 4, 2 jobs), so the fair order interleaves."""
    for g in ("a", "b", "c"):
        await queue.upsert_group(g, plan="free")
    for g, n in (("a", 9), ("b", 4), ("c", 2)):
        for i in range(n):
            await queue.enqueue(job_type, {"g": g, "i": i}, group_id=g)


async def _drain_order(queue: Queue, job_type: str,
                       prefetch: bool) -> tuple[list[str], RunResult]:
    order: list[str] = []

    async def handler(ctx: JobContext) -> None:
        order.append(f"{ctx.job.payload['g']}{ctx.job.payload['i']}")

    result = await Pipeline(queue, [Stage(job_type, 3, 2, handler, prefetch=prefetch)]).run()
    return order, result


async def test_prefetch_runs_the_same_jobs_in_the_same_fair_order(queue: Queue,
                                                                   aconn: AConn) -> None:
    """The next batch is claimed while the current one runs (its jobs are running, so
    they count as served exactly as when done): same order, each job once. Two types
    with the same backlog (served counts are per type)."""
    await _fair_backlog(queue, "plain")
    await _fair_backlog(queue, "fetched")
    expected, plain = await _drain_order(queue, "plain", prefetch=False)
    got, result = await _drain_order(queue, "fetched", prefetch=True)
    assert expected == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "a3", "b3",
                        "a4", "a5", "a6", "a7", "a8"]
    assert got == expected
    assert (result.stop_reason, result.jobs_done, result.jobs_deferred, result.summary) == \
        ("no_work", 15, 0, {})
    assert (plain.jobs_done, plain.summary) == (15, {})
    cur = await aconn.execute(sql.SQL(
        "SELECT status, attempts, deferrals, count(*) FROM {} WHERE type = 'fetched'"
        " GROUP BY 1, 2, 3").format(queue.table("jobs")))
    assert await cur.fetchall() == [("done", 1, 0, 15)]


async def test_a_prefetched_batch_the_run_never_starts_is_handed_back_untouched(
        queue: Queue) -> None:
    started: list[int] = []

    async def slow(ctx: JobContext) -> None:
        started.append(ctx.job.id)
        await asyncio.sleep(0.3)  # outlives the budget: the prefetched batch never starts

    ids = await enqueue_jobs(queue, "slow", 5)
    before = {i: (await job(queue, i)).run_after for i in ids}
    result = await Pipeline(queue, [Stage("slow", 2, 2, slow, prefetch=True)]).run(
        time_budget=timedelta(milliseconds=150))
    assert started == ids[:2]
    assert (result.stop_reason, result.jobs_done, result.jobs_deferred, result.summary) == \
        ("time_budget", 2, 0, {"prefetch_released": 2})
    for i in ids[2:4]:  # prefetched, released: as if never claimed
        j = await job(queue, i)
        assert (j.status, j.attempts, j.deferrals, j.locked_at, j.claim_token) == \
            ("pending", 0, 0, None, None)
        assert j.run_after == before[i]
    j = await job(queue, ids[4])
    assert (j.status, j.attempts, j.run_id) == ("pending", 0, None)


async def test_only_the_first_live_stage_prefetches(queue: Queue) -> None:
    """A later stage must not run ahead of an earlier one: its prefetch flag is ignored,
    so the job that its handler enqueues for the first stage runs next, as without it."""
    order: list[str] = []

    async def first(ctx: JobContext) -> None:
        order.append(f"a{ctx.job.payload['i']}")

    async def second(ctx: JobContext) -> None:
        order.append(f"b{ctx.job.payload['i']}")
        await ctx.queue.enqueue("a", {"i": ctx.job.payload["i"]})

    await enqueue_jobs(queue, "b", 3)
    result = await Pipeline(queue, [Stage("a", 1, 1, first, prefetch=True),
                                    Stage("b", 1, 1, second, prefetch=True)]).run()
    assert order == ["b0", "a0", "b1", "a1", "b2", "a2"]
    assert (result.jobs_done, result.summary) == (6, {})


async def test_release_is_fenced_by_the_claim(queue: Queue) -> None:
    [jid] = await enqueue_jobs(queue, "r", 1)
    [claimed] = await queue.claim("r", 1)
    assert claimed.id == jid
    stranger = Job(**{**claimed.__dict__, "claim_token": None})
    assert await queue.release([stranger]) == 0
    assert await queue.release([claimed]) == 1
    assert await queue.release([claimed]) == 0  # no longer held
    j = await job(queue, jid)
    assert (j.status, j.attempts, j.deferrals, j.claim_token) == ("pending", 0, 0, None)
    with pytest.raises(InvalidInput, match="expected a rota.Job"):
        await queue.release([jid])  # type: ignore[list-item]


def test_prefetch_must_be_a_bool() -> None:
    async def h(ctx: JobContext) -> None: ...

    with pytest.raises(InvalidInput, match="prefetch must be True or False, got 'yes'"):
        Stage("t", 1, 1, h, prefetch="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(("save_every", "seen_done"), [(0.0, [0, 1, 2]), (60.0, [0, 1, 1])])
async def test_progress_is_saved_after_a_batch_at_most_every_save_every_s(
        queue: Queue, aconn: AConn, monkeypatch: pytest.MonkeyPatch,
        save_every: float, seen_done: list[int]) -> None:
    """The first batch's progress is saved at once; later saves wait SAVE_EVERY_S (the
    heartbeat and the end of the run save anyway)."""
    monkeypatch.setattr("rota.runner.recording.SAVE_EVERY_S", save_every)
    seen: list[int] = []

    async def handler(ctx: JobContext) -> None:
        cur = await aconn.execute(sql.SQL("SELECT jobs_done FROM {} WHERE id = %s")
                                  .format(queue.table("runs")), [ctx.run_id])
        seen.append((await cur.fetchone())[0])

    await enqueue_jobs(queue, "p", 3)
    result = await Pipeline(queue, [Stage("p", 1, 1, handler)]).run()
    assert seen == seen_done
    assert (await run_row(aconn, queue, result))["jobs_done"] == 3


async def test_a_batch_claimed_while_the_last_ones_completion_fails_is_handed_back(
        queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next batch is claimed while the previous one's completion is written; when
    that write fails, the run ends in error and the new batch, never started, goes back
    untouched instead of staying locked until the stale window."""
    async def broken(self: Queue, jobs: Any, **kw: Any) -> list[bool]:
        raise psycopg.OperationalError("the connection was lost")

    monkeypatch.setattr(Queue, "complete_many", broken)
    started: list[int] = []

    async def handler(ctx: JobContext) -> None:
        started.append(ctx.job.id)

    ids = await enqueue_jobs(queue, "x", 4)
    result = await Pipeline(queue, [Stage("x", 2, 1, handler)]).run()
    assert (result.stop_reason, result.error) == \
        ("error", "OperationalError: the connection was lost")
    assert started == ids[:2]
    for i in ids[:2]:  # ran, completion lost: failed, retried after backoff
        j = await job(queue, i)
        assert (j.status, j.attempts, j.last_error) == \
            ("pending", 1, "the run stopped while the job was running")
    for i in ids[2:]:  # claimed, never started: as if never claimed
        j = await job(queue, i)
        assert (j.status, j.attempts, j.deferrals, j.claim_token) == ("pending", 0, 0, None)


async def test_the_runs_log_line_counts_the_jobs_it_will_retry(
        queue: Queue, caplog: pytest.LogCaptureFixture) -> None:
    """A job whose attempt failed and that will be retried (a handler timed out, say) is
    neither done nor failed: the run's line said "0 done, 0 failed, 0 deferred", as if
    it had touched nothing."""
    async def flaky(ctx: JobContext) -> None:
        if ctx.job.payload["i"] == 0:
            raise RuntimeError("try again")

    pipeline = Pipeline(queue, [Stage("t", 5, 1, flaky)])
    await enqueue_jobs(queue, "t", 2)
    with caplog.at_level("INFO", logger="rota.runner"):
        result = await pipeline.run(trigger="manual")
    assert result.summary["retries"] == 1
    lines = [r.getMessage() for r in caplog.records if " stopped " in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].endswith("(manual) stopped no_work: 1 done, 0 failed, 0 deferred, "
                             "1 retried")
