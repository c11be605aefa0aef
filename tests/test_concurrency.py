"""Concurrency edge cases on real concurrent connections: a lost run racing a new
claimer or the stuck sweeper, concurrent sweepers, claimers + sweepers + batch defers
together, and a dedupe race whose first enqueuer rolls back.

Each Queue made by ``make_queue`` has its own pool, so two queues are two sets of real
PostgreSQL sessions. Races are forced into one order or the other with a transaction
left open on purpose (its row lock is what the other side meets), and where the order
is left to chance, the invariant is checked whatever it turned out to be.

(Already covered elsewhere, not repeated here: 24 concurrent enqueues of one key and a
single rolled-back racer in test_queue.py; 4 concurrent ``rota migrate`` processes in
test_db.py.)
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Job, Queue

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")

AConn = psycopg.AsyncConnection[Any]


async def status_of(aconn: AConn, queue: Queue, job_id: int) -> tuple[str, int, Any]:
    cur = await aconn.execute(
        sql.SQL("SELECT status, attempts, claim_token FROM {} WHERE id = %s")
        .format(queue.table("jobs")), [job_id])
    row = await cur.fetchone()
    assert row is not None
    return row[0], row[1], row[2]


async def lost_claim(queue: Queue, job_type: str = "t", n: int = 1,
                     max_attempts: int | None = None) -> list[Job]:
    """Enqueue ``n`` jobs, claim them, and move the clock past the stale window: the
    claims are now a lost run's."""
    for i in range(n):
        assert await queue.enqueue(job_type, {"i": i}, max_attempts=max_attempts)
    claimed = await queue.claim(job_type, n)
    assert len(claimed) == n
    queue.clock_offset += timedelta(minutes=16)
    return claimed


async def hook_table(aconn: AConn, queue: Queue) -> None:
    await aconn.execute(sql.SQL("CREATE TABLE {} (job_id bigint PRIMARY KEY)")
                        .format(queue.table("refunds")))


def refund_hook(queue: Queue) -> Any:
    """A give-up hook that writes one row per job in the hook's transaction: a second
    run for the same job would fail on the primary key, and stay owed, never hidden."""
    async def refund(job: Job, conn: AConn) -> None:
        await conn.execute(sql.SQL("INSERT INTO {} VALUES (%s)")
                           .format(queue.table("refunds")), [job.id])
    return refund


async def refunds(aconn: AConn, queue: Queue) -> list[int]:
    cur = await aconn.execute(sql.SQL("SELECT job_id FROM {} ORDER BY 1")
                              .format(queue.table("refunds")))
    return [r[0] for r in await cur.fetchall()]


# -- a lost run against a new claimer -------------------------------------------------


async def test_new_claimer_holding_the_row_wins_and_the_lost_complete_is_told(
    make_queue: Any, database_url: str, aconn: AConn
) -> None:
    """The new claim is in flight (its transaction holds the row) when the lost run's
    complete arrives: the complete waits on the row, re-reads it after the claim
    commits, finds another claim, and reports the loss; the job stays with the claimer."""
    lost_run = await make_queue()
    claimer = await make_queue()
    [lost] = await lost_claim(lost_run)
    claimer.clock_offset = lost_run.clock_offset
    async with await psycopg.AsyncConnection.connect(database_url) as tx:
        [won] = await claimer.claim("t", 1, conn=tx)
        completing = asyncio.create_task(lost_run.complete(lost))
        await asyncio.sleep(0.2)
        assert not completing.done()  # waiting on the claimer's row lock
        await tx.commit()
    assert await completing is False
    assert await status_of(aconn, claimer, lost.id) == ("running", 2, won.claim_token)
    assert await claimer.complete(won) is True


async def test_lost_complete_holding_the_row_wins_and_the_claimer_gets_nothing(
    make_queue: Any, database_url: str, aconn: AConn
) -> None:
    """The lost run's complete is in flight first: the claimer skips the locked row (it
    never waits), and once the complete commits the job is done and claims nothing."""
    lost_run = await make_queue()
    claimer = await make_queue()
    [lost] = await lost_claim(lost_run)
    claimer.clock_offset = lost_run.clock_offset
    async with await psycopg.AsyncConnection.connect(database_url) as tx:
        assert await lost_run.complete(lost, conn=tx) is True
        assert await claimer.claim("t", 1) == []  # skipped, not blocked
        await tx.commit()
    assert await claimer.claim("t", 1) == []
    # The token of the claim that completed it stays (docs/design.md, "Settling twice").
    assert await status_of(aconn, claimer, lost.id) == ("done", 1, lost.claim_token)


@pytest.mark.parametrize("late", ["complete", "fail", "defer"])
async def test_many_lost_settles_racing_new_claimers_have_one_winner_each(
    make_queue: Any, aconn: AConn, late: str
) -> None:
    """40 lost claims: the lost run settles them (complete, fail or defer) one by one
    while three claimers reclaim them. Whatever the interleaving, each job has exactly
    one winner, and the loser is told."""
    lost_run = await make_queue()
    claimers = [await make_queue() for _ in range(3)]
    lost = await lost_claim(lost_run, n=40)
    for c in claimers:
        c.clock_offset = lost_run.clock_offset
    settled: dict[int, bool] = {}
    reclaimed: dict[int, list[Job]] = {}

    async def settle_all() -> None:
        for job in random.sample(lost, len(lost)):
            if late == "complete":
                settled[job.id] = await lost_run.complete(job)
            elif late == "fail":
                settled[job.id] = await lost_run.fail(job, "late") != "lost"
            else:
                settled[job.id] = await lost_run.defer(job) == 1

    async def reclaim(q: Queue) -> None:
        while batch := await q.claim("t", 3):
            for j in batch:
                reclaimed.setdefault(j.id, []).append(j)
            await asyncio.sleep(0)

    await asyncio.gather(settle_all(), *(reclaim(q) for q in claimers))
    for job in lost:
        status, attempts, token = await status_of(aconn, lost_run, job.id)
        claims = reclaimed.get(job.id, [])
        if not settled[job.id]:  # the lost run was told: exactly one claimer has it
            [winner] = claims
            assert (status, attempts, token) == ("running", 2, winner.claim_token)
        elif late == "complete":
            assert (status, attempts, claims) == ("done", 1, [])
        elif late == "fail":  # back off past the claimers' clock: nobody reclaimed it
            assert (status, attempts, claims) == ("pending", 1, [])
        else:  # deferred, due at once: at most one fresh claim (not a stale reclaim)
            assert len(claims) <= 1 and all(c.attempts == 1 for c in claims)
            expected = ("running", 1, claims[0].claim_token) if claims else ("pending", 0, None)
            assert (status, attempts, token) == expected


# -- a lost run against the stuck sweeper ----------------------------------------------


async def test_lost_complete_holding_the_row_beats_the_sweeper(
    make_queue: Any, database_url: str, aconn: AConn
) -> None:
    """The stuck sweeper skips a row a live transaction holds: a lost run completing its
    last attempt at that moment wins, and no give-up hook runs."""
    lost_run = await make_queue(max_attempts=1)
    sweeper = await make_queue(max_attempts=1)
    await hook_table(aconn, sweeper)
    sweeper.on_give_up("t", refund_hook(sweeper))
    [lost] = await lost_claim(lost_run)
    sweeper.clock_offset = lost_run.clock_offset
    async with await psycopg.AsyncConnection.connect(database_url) as tx:
        assert await lost_run.complete(lost, conn=tx) is True
        assert await sweeper.fail_stuck_jobs() == []
        await tx.commit()
    assert await sweeper.fail_stuck_jobs() == []
    assert await status_of(aconn, sweeper, lost.id) == ("done", 1, lost.claim_token)
    assert await refunds(aconn, sweeper) == []


async def test_many_lost_completes_racing_three_sweepers(
    make_queue: Any, aconn: AConn
) -> None:
    """60 jobs stuck on their last attempt; the lost run completes them while three
    sweepers fail them. Each job ends exactly one way: done (complete told True, in no
    sweeper's list, no refund) or failed (complete told False, in exactly one sweeper's
    list, refunded once)."""
    lost_run = await make_queue(max_attempts=1)
    sweepers = [await make_queue(max_attempts=1) for _ in range(3)]
    await hook_table(aconn, lost_run)
    lost = await lost_claim(lost_run, n=60)
    for s in sweepers:
        s.clock_offset = lost_run.clock_offset
        s.on_give_up("t", refund_hook(s))
    completed: dict[int, bool] = {}
    await asyncio.gather(*(lost_run.now() for _ in range(8)))  # open its pool's sessions

    async def complete_one(job: Job) -> None:
        completed[job.id] = await lost_run.complete(job)

    async def complete_all() -> None:  # several at a time, on the lost run's pool
        await asyncio.gather(*(complete_one(j) for j in random.sample(lost, len(lost))))

    async def sweep(q: Queue) -> list[int]:
        ids: list[int] = []
        await asyncio.sleep(0.01)  # give the completes a head start: both sides win some
        for _ in range(30):
            ids.extend(j.id for j in await q.fail_stuck_jobs())
            await asyncio.sleep(0)
        return ids

    _, *swept_lists = await asyncio.gather(complete_all(), *(sweep(s) for s in sweepers))
    swept = [i for ids in swept_lists for i in ids]
    assert len(swept) == len(set(swept))
    failed = sorted(j.id for j in lost if not completed[j.id])
    assert sorted(swept) == failed
    assert await refunds(aconn, lost_run) == failed
    for job in lost:
        status, _, _ = await status_of(aconn, lost_run, job.id)
        assert status == ("done" if completed[job.id] else "failed")


# -- concurrent sweepers -----------------------------------------------------------------


async def test_concurrent_sweepers_fail_each_stuck_job_once_and_refund_once(
    make_queue: Any, aconn: AConn
) -> None:
    first = await make_queue(max_attempts=1)
    await hook_table(aconn, first)
    stuck = await lost_claim(first, n=80)
    sweepers = [await make_queue(max_attempts=1) for _ in range(4)]
    calls: list[int] = []

    for s in sweepers:
        s.clock_offset = first.clock_offset
        hook = refund_hook(s)

        async def counted(job: Job, conn: AConn, hook: Any = hook) -> None:
            calls.append(job.id)
            await hook(job, conn)

        s.on_give_up("t", counted)

    results = await asyncio.gather(*(s.fail_stuck_jobs() for s in sweepers))
    swept = [j.id for r in results for j in r]
    assert sorted(swept) == sorted(j.id for j in stuck)  # each failed once, by one sweeper
    assert sorted(calls) == sorted(swept)  # each hook called once
    assert await refunds(aconn, first) == sorted(swept)
    assert await asyncio.gather(*(s.fail_stuck_jobs() for s in sweepers)) == [[]] * 4
    assert await asyncio.gather(*(s.run_give_up_hooks() for s in sweepers)) == [0] * 4


# -- no deadlock -------------------------------------------------------------------------


async def test_claimers_sweepers_batch_defers_and_heartbeats_never_deadlock(
    make_queue: Any, aconn: AConn
) -> None:
    """Three claimers settle their batches with batch defers (jobs passed in reverse id
    order), completes and heartbeats, while two sweepers whose clock is an hour ahead
    fail the same running jobs as stuck and run their hooks, and a third process
    postpones pending ones. Every statement that locks several rows locks them in id
    order, so PostgreSQL never detects a deadlock (it would raise DeadlockDetected after
    deadlock_timeout), and every job ends settled."""
    setup = await make_queue(max_attempts=1)
    await hook_table(aconn, setup)
    await setup.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(400)])
    claimers = [await make_queue(max_attempts=1) for _ in range(3)]
    sweepers = [await make_queue(max_attempts=1) for _ in range(2)]
    postponer = await make_queue(max_attempts=1)
    for s in sweepers:
        s.clock_offset = timedelta(hours=1)
        s.on_give_up("t", refund_hook(s))
    done = asyncio.Event()
    rng = random.Random(7)

    async def claim_loop(q: Queue) -> None:
        for _ in range(40):
            batch = await q.claim("t", 12)  # may come back empty while rows are locked
            if batch:
                async with q.connection() as c:  # a heartbeat over the batch, reversed
                    await c.execute(q.sql("heartbeat"), {
                        "ids": [j.id for j in reversed(batch)],
                        "claim_tokens": [j.claim_token for j in reversed(batch)],
                        "offset": q.clock_offset})
            await asyncio.sleep(0.005)  # held while the sweepers look
            keep = [j for j in batch if rng.random() < 0.5]
            back = [j for j in batch if j not in keep]
            await q.defer(list(reversed(back)))  # batch defer, reverse order on purpose
            for j in keep:
                await q.complete(j)
        done.set()

    async def sweep_loop(q: Queue) -> None:
        while not done.is_set():
            await q.fail_stuck_jobs()
            await asyncio.sleep(0)

    async def postpone_loop() -> None:  # locks pending rows in id order, due now
        while not done.is_set():
            until = await postponer.now()
            async with postponer.connection() as c:
                await c.execute(postponer.sql("postpone"), {
                    "type": "t", "until": until, "offset": postponer.clock_offset,
                    "stale_after": postponer.stale_after})
            await asyncio.sleep(0.01)

    await asyncio.wait_for(asyncio.gather(
        *(claim_loop(q) for q in claimers), *(sweep_loop(s) for s in sweepers),
        postpone_loop()), timeout=60)
    cur = await aconn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY 1")
                              .format(setup.table("jobs")))
    counts = dict(await cur.fetchall())
    assert set(counts) <= {"pending", "done", "failed"}
    assert sum(counts.values()) == 400
    failed = counts.get("failed", 0)
    assert failed > 0 and counts.get("done", 0) > 0  # the sweepers really raced the claimers
    assert len(await refunds(aconn, setup)) == failed  # every swept job refunded once


# -- dedupe race with a rollback -----------------------------------------------------------


@pytest.mark.parametrize("batch", [False, True])
async def test_first_enqueuer_rolls_back_while_five_wait_on_the_key(
    queue: Queue, database_url: str, aconn: AConn, batch: bool
) -> None:
    """The first transaction holds the dedupe key uncommitted; five others (single or
    batch enqueues) wait on it. It rolls back: exactly one waiter creates the job, the
    other four see it and create nothing, and one open job remains."""
    async def enqueue(conn: AConn, n: int) -> int:
        if batch:
            return await queue.enqueue_many(
                [{"type": "search", "payload": {"n": n}, "dedupe_key": "brief:7"}], conn=conn)
        return int(await queue.enqueue("search", {"n": n}, dedupe_key="brief:7",
                                       conn=conn) is not None)

    conns = [await psycopg.AsyncConnection.connect(database_url) for _ in range(6)]
    try:
        first, *waiters = conns
        for c in conns:  # each caller's transaction is already open (see also
            await c.execute("SELECT 1")  # test_queue: enqueue_many opening it)
        assert await enqueue(first, 0) == 1
        tasks = [asyncio.create_task(enqueue(c, i + 1)) for i, c in enumerate(waiters)]
        await asyncio.sleep(0.3)
        assert not any(t.done() for t in tasks)  # all blocked on the uncommitted key
        await first.rollback()

        async def commit_after(task: asyncio.Task[int], conn: AConn) -> int:
            created = await task
            await conn.commit()
            return created

        created = await asyncio.gather(
            *(commit_after(t, c) for t, c in zip(tasks, waiters, strict=True)))
    finally:
        for c in conns:
            await c.close()
    assert sorted(created) == [0, 0, 0, 0, 1]
    cur = await aconn.execute(
        sql.SQL("SELECT payload, status FROM {} WHERE dedupe_key = 'brief:7'")
        .format(queue.table("jobs")))
    [(payload, status)] = await cur.fetchall()
    assert status == "pending" and payload == {"n": created.index(1) + 1}


# -- a claimer whose candidates another claimer holds reads on ------------------------


@pytest.mark.parametrize("group", ["g", None], ids=["one group", "group-less"])
async def test_a_claimer_reads_past_jobs_an_open_claim_holds(
    make_queue: Any, database_url: str, group: str | None
) -> None:
    # docs/design.md#claim: the first claim's transaction is still open and holds jobs 1
    # and 2; 18 more are due and unlocked, so the second claimer gets the next two in
    # fair order, and only "nothing" once nothing claimable is left.
    first, second = await make_queue(), await make_queue()
    if group:
        await first.upsert_group(group, plan=None)
    await first.enqueue_many([{"type": "t", "payload": {"i": i}, "group_id": group}
                              for i in range(20)])
    ids = sorted([j.id for j in await first.claim("t", 20, conn=None)])
    async with first.pool.connection() as c:  # hand them back: all 20 pending again
        await first.release(await _jobs(first, c, ids), conn=c)
    async with await psycopg.AsyncConnection.connect(database_url) as held:
        got1 = await first.claim("t", 2, conn=held)
        assert [j.id for j in got1] == ids[:2]
        got2 = await second.claim("t", 2)
        assert [j.id for j in got2] == ids[2:4]
        await held.rollback()
    async with first.pool.connection() as c:
        await first.release(got2, conn=c)
    # Every job held by the open claim: "nothing" (a claim that takes none writes no
    # bookkeeping, so it does not wait on the open claim's served-count rows).
    async with await psycopg.AsyncConnection.connect(database_url) as held:
        assert len(await first.claim("t", 20, conn=held)) == 20
        assert await second.claim("t", 2) == []
        await held.rollback()
    again = await second.claim("t", 2)
    assert [j.id for j in again] == ids[:2]


async def _jobs(queue: Queue, conn: Any, ids: list[int]) -> list[Job]:
    out = []
    for i in ids:
        job = await queue.get_job(i, conn=conn)
        assert job is not None
        out.append(job)
    return out
