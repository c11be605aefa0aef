"""The queue's rules on a real PostgreSQL: dedupe, claim, stale locks, fail, defer,
fencing of lost runs, stuck jobs and give-up hooks. Times come from the database clock
and move with clock_offset."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from rota import Job, Queue, SyncQueue


async def db_now(conn: Any) -> datetime:
    return (await (await conn.execute("SELECT now()")).fetchone())[0]


async def row(conn: Any, queue: Queue, job_id: int) -> dict[str, Any]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(f'SELECT * FROM "{queue.schema}".jobs WHERE id = %s', [job_id])
    return await cur.fetchone()  # type: ignore[no-any-return]


# -- dedupe --------------------------------------------------------------------------


async def test_twenty_concurrent_enqueues_of_one_key_make_one_open_job(
    queue: Queue, database_url: str, aconn: Any
) -> None:
    async def one(i: int) -> Job | None:
        async with await psycopg.AsyncConnection.connect(database_url) as c:
            job = await queue.enqueue("search", {"i": i}, dedupe_key="brief:42", conn=c)
            await asyncio.sleep(0.05)  # hold the transaction open so the inserts overlap
            await c.commit()
            return job

    results = await asyncio.gather(*(one(i) for i in range(24)))
    assert sum(r is not None for r in results) == 1
    cur = await aconn.execute(
        f'SELECT count(*) FROM "{queue.schema}".jobs WHERE dedupe_key = %s', ["brief:42"])
    assert (await cur.fetchone())[0] == 1

    [job] = await queue.claim("search", 1)
    assert await queue.enqueue("search", {}, dedupe_key="brief:42") is None  # still open
    assert await queue.complete(job) is True
    again = await queue.enqueue("search", {}, dedupe_key="brief:42")
    assert again is not None and again.id != job.id and again.status == "pending"


async def test_enqueue_in_rolled_back_transaction_leaves_nothing(
    queue: Queue, database_url: str, aconn: Any
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        job = await queue.enqueue("search", {"x": 1}, dedupe_key="k", conn=c)
        assert job is not None
        n = await queue.enqueue_many([{"type": "search", "payload": {}}] * 3, conn=c)
        assert n == 3
        await c.rollback()
    cur = await aconn.execute(f'SELECT count(*) FROM "{queue.schema}".jobs')
    assert (await cur.fetchone())[0] == 0
    assert await queue.enqueue("search", {}, dedupe_key="k") is not None


async def test_dedupe_race_where_the_first_rolls_back(
    queue: Queue, database_url: str, aconn: Any
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as first, \
            await psycopg.AsyncConnection.connect(database_url) as second:
        assert await queue.enqueue("search", {"n": 1}, dedupe_key="race", conn=first)
        waiting = asyncio.create_task(
            queue.enqueue("search", {"n": 2}, dedupe_key="race", conn=second))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # blocked on the first's uncommitted key
        await first.rollback()
        job = await waiting
        await second.commit()
    assert job is not None and job.payload == {"n": 2}
    cur = await aconn.execute(f'SELECT count(*) FROM "{queue.schema}".jobs')
    assert (await cur.fetchone())[0] == 1


async def test_enqueue_many_skips_duplicates_inside_and_outside_the_batch(queue: Queue) -> None:
    await queue.enqueue("a", {}, dedupe_key="x")
    n = await queue.enqueue_many([
        {"type": "a", "payload": {"i": 1}, "dedupe_key": "x"},
        {"type": "a", "payload": {"i": 2}, "dedupe_key": "y"},
        {"type": "a", "payload": {"i": 3}, "dedupe_key": "y"},
        {"type": "a", "payload": {"i": 4}},
    ])
    assert n == 2
    claimed = await queue.claim("a", 10)
    assert sorted(j.payload.get("i", 0) for j in claimed) == [0, 2, 4]


# -- claim ---------------------------------------------------------------------------


async def test_concurrent_claimers_never_share_a_job(make_queue: Any) -> None:
    queue = await make_queue()
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(300)])
    claimers = [await make_queue() for _ in range(6)]  # separate pools: real connections
    seen: list[int] = []

    async def drain(q: Queue) -> None:
        while batch := await q.claim("t", 7):
            seen.extend(j.id for j in batch)
            await asyncio.sleep(0)

    await asyncio.gather(*(drain(q) for q in claimers))
    assert len(seen) == 300 and len(set(seen)) == 300


async def test_stale_running_job_is_reclaimed_with_one_more_attempt(queue: Queue) -> None:
    job = await queue.enqueue("t", {})
    assert job
    [first] = await queue.claim("t", 1)
    assert await queue.claim("t", 1) == []  # the lock is fresh
    queue.clock_offset = timedelta(minutes=14, seconds=59)
    assert await queue.claim("t", 1) == []
    queue.clock_offset = timedelta(minutes=15, seconds=1)
    [second] = await queue.claim("t", 1)
    assert second.id == job.id and second.attempts == 2
    assert second.claim_token != first.claim_token
    # The lost attempt gets its error when the job is claimed again, once.
    [lost] = (await queue.result(job.id)).errors
    assert (lost.attempt, lost.error_type, lost.traceback, lost.error) == (
        1, "rota.errors.AttemptLost", None,
        "AttemptLost: the run holding this attempt stopped without settling it (killed, "
        "or cut off from the database); its lock went stale and the job was claimed "
        "again")
    assert lost.failed_at - await queue.now() < timedelta(seconds=5)
    assert await queue.fail(second, "boom") == "retry"
    queue.clock_offset = timedelta(hours=1)
    [third] = await queue.claim("t", 1)
    assert third.attempts == 3
    assert [e.attempt for e in (await queue.result(job.id)).errors] == [1, 2]


async def test_stale_job_with_attempts_used_up_is_stuck_and_hook_runs_once(
    make_queue: Any, aconn: Any
) -> None:
    queue = await make_queue(max_attempts=2)
    refunds: list[int] = []

    async def refund(job: Job, conn: Any) -> None:
        refunds.append(job.id)
        await conn.execute("SELECT 1")

    queue.on_give_up("draft", refund)
    job = await queue.enqueue("draft", {})
    assert job
    for minutes in (0, 16):
        queue.clock_offset = timedelta(minutes=minutes)
        [claimed] = await queue.claim("draft", 1)
    assert claimed.attempts == 2
    queue.clock_offset = timedelta(minutes=40)
    assert await queue.claim("draft", 1) == []  # attempts used up: never reclaimed
    stuck = await queue.fail_stuck_jobs()
    assert [j.id for j in stuck] == [job.id]
    assert stuck[0].status == "failed" and stuck[0].last_error is not None
    assert refunds == [job.id]
    assert await queue.fail_stuck_jobs() == []
    assert await queue.run_give_up_hooks() == 0
    assert refunds == [job.id]
    r = await row(aconn, queue, job.id)
    assert r["status"] == "failed" and r["give_up_pending"] is False
    assert r["finished_at"] - await db_now(aconn) > timedelta(minutes=39)


# -- fail ----------------------------------------------------------------------------


async def test_fail_backs_off_two_then_four_minutes_then_fails(queue: Queue, aconn: Any) -> None:
    job = await queue.enqueue("t", {})
    assert job
    [c] = await queue.claim("t", 1)
    assert await queue.fail(c, RuntimeError("boom 1")) == "retry"
    r = await row(aconn, queue, job.id)
    assert (r["status"], r["attempts"], r["last_error"]) == ("pending", 1, "RuntimeError: boom 1")
    assert r["run_after"] - await db_now(aconn) == pytest.approx(
        timedelta(minutes=2), abs=timedelta(seconds=2))
    assert await queue.claim("t", 1) == []  # not due yet

    queue.clock_offset = timedelta(minutes=2, seconds=1)
    [c] = await queue.claim("t", 1)
    assert await queue.fail(c, "boom 2") == "retry"
    r = await row(aconn, queue, job.id)
    assert r["attempts"] == 2
    assert r["run_after"] - (await db_now(aconn) + queue.clock_offset) == pytest.approx(
        timedelta(minutes=4), abs=timedelta(seconds=2))

    queue.clock_offset += timedelta(minutes=4, seconds=1)
    [c] = await queue.claim("t", 1)
    assert c.attempts == 3
    assert await queue.fail(c, "boom 3") == "failed"
    r = await row(aconn, queue, job.id)
    assert (r["status"], r["attempts"], r["last_error"]) == ("failed", 3, "boom 3")
    assert r["locked_at"] is None and r["give_up_pending"] is True  # no hook registered
    assert r["finished_at"] - (await db_now(aconn) + queue.clock_offset) == pytest.approx(
        timedelta(0), abs=timedelta(seconds=2))


async def test_error_text_with_nul_is_stored_escaped(queue: Queue, aconn: Any) -> None:
    job = await queue.enqueue("t", {}, max_attempts=1)
    assert job
    [c] = await queue.claim("t", 1)
    assert await queue.fail(c, "bad\x00byte") == "failed"
    assert (await row(aconn, queue, job.id))["last_error"] == "bad\\0byte"


# -- defer ---------------------------------------------------------------------------


async def test_job_deferred_three_times_keeps_all_attempts(queue: Queue, aconn: Any) -> None:
    job = await queue.enqueue("t", {})
    assert job
    [c] = await queue.claim("t", 1)
    await queue.fail(c, "first try")
    for i in range(3):
        queue.clock_offset = timedelta(hours=i + 1)
        [c] = await queue.claim("t", 1)
        assert c.attempts == 2
        until = await db_now(aconn) + queue.clock_offset + timedelta(minutes=30)
        assert await queue.defer([c], until) == 1
    r = await row(aconn, queue, job.id)
    assert (r["status"], r["attempts"], r["deferrals"]) == ("pending", 1, 3)
    assert r["last_error"] == "first try"
    # The last claim's token stays, so a repeated defer is recognised (docs/design.md,
    # "Settling twice").
    assert r["locked_at"] is None and r["claim_token"] == c.claim_token
    assert r["run_after"] == until


async def test_many_deferrals_are_not_capped_by_default(queue: Queue, aconn: Any) -> None:
    job = await queue.enqueue("t", {})
    assert job
    for _ in range(20):
        [c] = await queue.claim("t", 1)
        assert await queue.defer(c) == 1
    r = await row(aconn, queue, job.id)
    assert (r["status"], r["attempts"], r["deferrals"]) == ("pending", 0, 20)


async def test_deferral_cap_gives_up(make_queue: Any, aconn: Any) -> None:
    queue = await make_queue(max_deferrals=2)
    job = await queue.enqueue("t", {})
    assert job
    for expected in (1, 1, 0):
        [c] = await queue.claim("t", 1)
        assert await queue.defer(c) == expected
    r = await row(aconn, queue, job.id)
    assert (r["status"], r["deferrals"], r["last_error"]) == (
        "failed", 3, "deferred more than 2 times")


async def test_deferring_jobs_not_under_our_claim_changes_nothing(
    queue: Queue, aconn: Any
) -> None:
    pending = await queue.enqueue("t", {"p": 1})
    assert pending
    done_job = await queue.enqueue("t", {"p": 2})
    failed_job = await queue.enqueue("t", {"p": 3}, max_attempts=1)
    claimed = {j.payload["p"]: j for j in await queue.claim("t", 3)}
    await queue.complete(claimed[2])
    await queue.fail(claimed[3], "x")
    await queue.defer(claimed[1])  # pending again; `pending` the old snapshot
    before = [await row(aconn, queue, j.id) for j in (pending, done_job, failed_job)]  # type: ignore[union-attr]
    stale_views = [pending, claimed[1], claimed[2], claimed[3]]
    # claimed[1] is a repeat of the deferral its claim made: counted as deferred, as it
    # was (docs/design.md, "Settling twice"); nothing changes for any of them.
    assert await queue.defer(stale_views) == 1
    after = [await row(aconn, queue, j.id) for j in (pending, done_job, failed_job)]  # type: ignore[union-attr]
    assert after == before


# -- fencing: a lost run cannot stomp ------------------------------------------------


async def test_lost_run_cannot_complete_fail_or_defer_a_reclaimed_job(
    queue: Queue, aconn: Any
) -> None:
    job = await queue.enqueue("t", {})
    assert job
    [lost] = await queue.claim("t", 1)
    queue.clock_offset = timedelta(minutes=16)
    [winner] = await queue.claim("t", 1)
    assert winner.status == lost.status == "running"
    assert await queue.complete(lost) is False
    assert await queue.fail(lost, "late") == "lost"
    assert await queue.defer(lost) == 0
    r = await row(aconn, queue, job.id)
    assert (r["status"], r["attempts"], r["last_error"]) == ("running", 2, None)
    assert r["claim_token"] == winner.claim_token
    assert await queue.complete(winner) is True


async def test_lost_run_racing_the_stuck_sweeper(make_queue: Any, aconn: Any) -> None:
    queue = await make_queue(max_attempts=1)
    job = await queue.enqueue("t", {})
    assert job
    [c] = await queue.claim("t", 1)
    queue.clock_offset = timedelta(minutes=16)
    results = await asyncio.gather(queue.complete(c), queue.fail_stuck_jobs())
    completed, stuck = results
    assert completed != bool(stuck)  # exactly one outcome wins
    r = await row(aconn, queue, job.id)
    assert r["status"] == ("done" if completed else "failed")


# -- give-up hooks -------------------------------------------------------------------


async def test_give_up_hook_that_raises_is_retried_later_and_never_doubled(
    queue: Queue, aconn: Any
) -> None:
    await aconn.execute(f'CREATE TABLE "{queue.schema}".refunds (job_id bigint PRIMARY KEY)')
    calls = 0

    async def refund(job: Job, conn: Any) -> None:
        nonlocal calls
        calls += 1
        await conn.execute(f'INSERT INTO "{queue.schema}".refunds VALUES (%s)', [job.id])
        if calls == 1:
            raise RuntimeError("payment provider down")

    queue.on_give_up("draft", refund)
    job = await queue.enqueue("draft", {}, max_attempts=1)
    assert job
    [c] = await queue.claim("draft", 1)
    assert await queue.fail(c, "x") == "failed"
    cur = await aconn.execute(f'SELECT count(*) FROM "{queue.schema}".refunds')
    assert (await cur.fetchone())[0] == 0  # the raising hook's write rolled back
    assert await queue.run_give_up_hooks() == 1
    assert await queue.run_give_up_hooks() == 0
    cur = await aconn.execute(f'SELECT count(*) FROM "{queue.schema}".refunds')
    assert (await cur.fetchone())[0] == 1 and calls == 2


async def test_hook_owed_after_a_process_without_hooks_failed_the_job(
    database_url: str, schema: str, make_queue: Any
) -> None:
    without_hooks = await make_queue()
    job = await without_hooks.enqueue("draft", {}, max_attempts=1)
    assert job
    [c] = await without_hooks.claim("draft", 1)
    assert await without_hooks.fail(c, "x") == "failed"  # dies before any hook could run
    ran: list[int] = []

    async def hook(j: Job, conn: Any) -> None:
        ran.append(j.id)

    with_hooks = await make_queue()
    with_hooks.on_give_up("draft", hook)
    assert await asyncio.gather(with_hooks.run_give_up_hooks(),
                                with_hooks.run_give_up_hooks()) in ([1, 0], [0, 1])
    assert ran == [job.id]


# -- clock ---------------------------------------------------------------------------


async def test_run_after_in_the_future_waits_for_the_queue_clock(
    queue: Queue, aconn: Any
) -> None:
    due = await db_now(aconn) + timedelta(hours=2)
    job = await queue.enqueue("t", {}, run_after=due)
    assert job and job.run_after == due
    assert await queue.claim("t", 1) == []
    queue.clock_offset = timedelta(hours=2, seconds=1)
    assert [j.id for j in await queue.claim("t", 1)] == [job.id]


# -- the caller's transaction and dropped connections ----------------------------------


async def test_enqueue_many_as_the_first_statement_rolls_back_with_the_caller(
    queue: Queue, database_url: str, aconn: Any
) -> None:
    """A batch enqueue that opens the caller's transaction must not commit it on its
    own: the jobs exist if and only if the caller commits (docs/design.md, "Enqueue")."""
    async with await psycopg.AsyncConnection.connect(database_url) as c:
        assert await queue.enqueue_many([{"type": "t", "payload": {"i": 1}}] * 2, conn=c) == 2
        await c.rollback()

    def sync_batch() -> None:
        with psycopg.connect(database_url) as conn:
            assert SyncQueue(schema=queue.schema).enqueue_many(
                conn, [{"type": "t", "payload": {"i": 2}}]) == 1
            conn.rollback()

    await asyncio.to_thread(sync_batch)
    cur = await aconn.execute(f'SELECT count(*) FROM "{queue.schema}".jobs')
    assert (await cur.fetchone())[0] == 0


async def test_the_pool_replaces_connections_the_server_closed_while_idle(
    database_url: str, schema: str, aconn: Any
) -> None:
    """What a database restart does to a pool: every idle session is terminated. The
    queue's next statements get fresh connections instead of failing one by one."""
    app = f"rota-test-{schema}"
    queue = Queue(make_conninfo(database_url, application_name=app), schema=schema)
    async with queue:
        await queue.migrate()
        # Several idle sessions: held at once, so the pool must open them (concurrent
        # calls alone may all run on one connection when the machine is busy).
        async with queue.connection() as a, queue.connection() as b, \
                queue.connection() as c:
            for conn in (a, b, c):
                await conn.execute("SELECT 1")
        cur = await aconn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) "
            "FROM pg_stat_activity WHERE application_name = %s", [app])
        assert (await cur.fetchone())[0] >= 2
        assert await queue.enqueue("t", {}) is not None
        assert len(await asyncio.gather(*(queue.now() for _ in range(4)))) == 4
        [job] = await queue.claim("t", 1)
        assert await queue.complete(job) is True


async def test_after_a_restart_one_dead_connection_replaces_the_whole_idle_pool(
    database_url: str, schema: str, aconn: Any
) -> None:
    """A restart closes every idle session at once. psycopg_pool waits after each failed
    check before it tries the next idle connection, doubling the wait (0, 1, 2, 4, 8,
    16 s): eight dead connections checked one by one held the next statement past the
    pool's 30 s timeout, so a worker's run cut off by a restart could not record its
    end within its platform timeout (the multi-host chaos run saw it exit at that
    timeout, and its run later marked killed). The first dead connection found drains
    the pool: the rest are replaced without being handed out and checked."""
    app = f"rota-test-{schema}"
    queue = Queue(make_conninfo(database_url, application_name=app), schema=schema)
    async with queue:
        await queue.migrate()
        async with contextlib.AsyncExitStack() as held:  # eight idle sessions at once
            conns = [await held.enter_async_context(queue.connection()) for _ in range(8)]
            for conn in conns:
                await conn.execute("SELECT 1")
            old = {conn.info.backend_pid for conn in conns}
        assert queue.pool.get_stats()["pool_available"] == 8
        cur = await aconn.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) "
            "FROM pg_stat_activity WHERE application_name = %s", [app])
        assert (await cur.fetchone())[0] == 8
        now = await asyncio.wait_for(queue.now(), 20)  # before the fix: PoolTimeout
        assert now.tzinfo is not None
        # Only the first connection handed out was found dead; seven more held at once
        # are all new sessions.
        assert queue.pool.get_stats().get("connections_lost", 0) == 1
        async with contextlib.AsyncExitStack() as held:
            conns = [await held.enter_async_context(queue.connection()) for _ in range(7)]
            for conn in conns:
                await conn.execute("SELECT 1")
            assert not {conn.info.backend_pid for conn in conns} & old
        assert queue.pool.get_stats().get("connections_lost", 0) == 1
