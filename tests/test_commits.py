"""Counters and states show what committed (docs/design.md, "Counters show what
committed"), and settling twice is harmless (docs/design.md, "Settling twice"): a job
completed in a handler's own transaction counts done only if that transaction
committed, else it fails with the error and its backoff; complete, fail and defer
repeated under the same claim answer what the first one did, so the runner sends them
again across a dropped connection."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import JobContext, Pipeline, Queue, Stage
from tests.helpers import job_state

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")

AConn = psycopg.AsyncConnection[Any]


@pytest.fixture
async def ledger(queue: Queue, aconn: AConn) -> str:
    """A table whose unique constraint is checked at COMMIT (deferred)."""
    await aconn.execute(sql.SQL(
        "CREATE TABLE {} (k int, CONSTRAINT ledger_k UNIQUE (k) DEFERRABLE INITIALLY "
        "DEFERRED)").format(queue.table("ledger")))
    return queue.schema


# -- a completion in the handler's transaction ------------------------------------------


async def test_a_completion_whose_commit_fails_is_a_failure_with_its_error(
    queue: Queue, aconn: AConn, ledger: str
) -> None:
    """The issue's handler: ctx.complete(conn=c) in its own transaction, whose COMMIT
    fails on a deferred unique constraint. The run said jobs_done = 1, the job stayed
    running for the 15-minute stale window and its error was never stored. Now: no job
    done, the job pending again with the error and its 2-minute backoff."""
    table = queue.table("ledger")

    async def handler(ctx: JobContext) -> None:
        async with ctx.connection() as c, c.transaction():
            await c.execute(sql.SQL("INSERT INTO {} VALUES (1), (1)").format(table))
            assert await ctx.complete(conn=c) is True  # matched, not yet committed

    job = await queue.enqueue("t", {})
    assert job
    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run()
    assert (result.stop_reason, result.jobs_done, result.jobs_failed) == ("no_work", 0, 0)
    assert result.summary == {"retries": 1}
    status, attempts, error, due_in = await job_state(aconn, queue, job.id)
    assert (status, attempts) == ("pending", 1)
    assert error.startswith('UniqueViolation: duplicate key value violates unique '
                            'constraint "ledger_k"')
    assert timedelta(seconds=119) < due_in <= timedelta(minutes=2)


async def test_a_completion_whose_commit_went_through_counts_once(
    queue: Queue, aconn: AConn, ledger: str
) -> None:
    table = queue.table("ledger")

    async def handler(ctx: JobContext) -> None:
        async with ctx.connection() as c, c.transaction():
            await c.execute(sql.SQL("INSERT INTO {} VALUES (%s)").format(table),
                            [ctx.job.id])
            await ctx.complete(conn=c)

    ids = [j.id for j in [await queue.enqueue("t", {}) for _ in range(3)] if j]
    result = await Pipeline(queue, [Stage("t", 3, 2, handler)]).run()
    assert (result.jobs_done, result.summary) == (3, {})
    for i in ids:
        assert (await job_state(aconn, queue, i))[:2] == ("done", 1)


async def test_a_handler_that_swallows_the_failed_commit_still_fails_the_job(
    queue: Queue, aconn: AConn, ledger: str
) -> None:
    table = queue.table("ledger")

    async def handler(ctx: JobContext) -> None:
        try:
            async with ctx.connection() as c, c.transaction():
                await c.execute(sql.SQL("INSERT INTO {} VALUES (7), (7)").format(table))
                await ctx.complete(conn=c)
        except psycopg.errors.UniqueViolation:
            pass  # returns normally: the runner still reads what committed

    job = await queue.enqueue("t", {})
    assert job
    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run()
    assert (result.jobs_done, result.summary) == (0, {"retries": 1})
    assert (await job_state(aconn, queue, job.id))[:3] == (
        "pending", 1, "the transaction that completed the job did not commit")


# -- settling twice ---------------------------------------------------------------------------


async def test_complete_fail_and_defer_repeated_under_the_same_claim_answer_the_same(
    make_queue: Any
) -> None:
    queue: Queue = await make_queue(max_attempts=2)
    for _ in range(4):
        await queue.enqueue("t", {})
    a, b, c, d = await queue.claim("t", 4)
    # The case: complete's reply lost after the server committed it; the
    # client asks again and used to get False, rota's "lost".
    assert await queue.complete(a) is True
    assert await queue.complete(a) is True
    assert await queue.complete_many([a, a]) == [True, True]
    assert await queue.fail(b, "x") == "retry"
    assert await queue.fail(b, "x") == "retry"
    assert await queue.defer(c) == 1
    assert await queue.defer([c, c]) == 1
    # What the first settled stays: repeats change nothing.
    jb, jc = await queue.get_job(b.id), await queue.get_job(c.id)
    assert jb is not None and (jb.status, jb.attempts) == ("pending", 1)
    assert jc is not None and (jc.status, jc.attempts, jc.deferrals) == ("pending", 0, 1)
    # On the last attempt the repeat says failed, as the first did.
    queue.clock_offset = timedelta(minutes=3)
    [b2] = await queue.claim("t", 1)
    assert b2.id == b.id
    assert await queue.fail(b2, "y") == "failed"
    assert await queue.fail(b2, "y") == "failed"
    # Another claim's settlement is not this claim's: the old claim lost the job.
    assert await queue.fail(b, "z") == "lost"
    assert await queue.complete(b) is False
    assert await queue.complete(d) is True
    queue.clock_offset += timedelta(minutes=16)
    assert await queue.claim_states([a, b, b2, c, d]) == {
        a.id: "done", b2.id: "failed", c.id: "pending", d.id: "done"}


class DropAfterCommit:
    """Runs the named statement, then raises as if the connection dropped before its
    reply was read (the server has committed it), the first ``times`` times."""

    def __init__(self, queue: Queue, method: str, statement: str, times: int = 1) -> None:
        self.real = getattr(queue.store, method)
        self.statement = statement
        self.times = times

    async def __call__(self, name: str, params: Any, **kw: Any) -> Any:
        result = await self.real(name, params, **kw)
        if name == self.statement and self.times > 0:
            self.times -= 1
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result


@pytest.mark.parametrize(("method", "statement", "kind"), [
    ("fetch_all", "complete_many", "done"),
    ("fetch_one", "fail", "retry"),
    ("fetch_all", "defer", "deferred"),
])
async def test_the_runner_sends_a_settlement_again_across_a_dropped_connection(
    queue: Queue, monkeypatch: pytest.MonkeyPatch, method: str, statement: str, kind: str
) -> None:
    from rota import DeferJob

    async def handler(ctx: JobContext) -> None:
        if kind == "retry":
            raise RuntimeError("boom")
        if kind == "deferred":
            raise DeferJob()

    job = await queue.enqueue("t", {})
    assert job
    monkeypatch.setattr(queue.store, method, DropAfterCommit(queue, method, statement))
    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run(
        time_budget=timedelta(seconds=0.5))
    assert result.stop_reason in ("no_work", "time_budget")
    assert "lost" not in result.summary
    got = await queue.get_job(job.id)
    assert got is not None
    if kind == "done":
        assert result.jobs_done == 1 and got.status == "done"
    elif kind == "retry":
        assert result.summary["retries"] == 1
        assert (got.status, got.attempts, got.last_error) == ("pending", 1,
                                                               "RuntimeError: boom")
    else:
        assert result.jobs_deferred == 1
        assert (got.status, got.attempts, got.deferrals) == ("pending", 0, 1)
