"""The claim stays exact as time moves on while the bookkeeping stays as it was: a
running job's lock goes stale, a deferred job comes due, a paused group resumes, and no
upkeep has run since (under load the upkeep lags, and a claim on the caller's
connection never schedules it). The upkeep may make claims cheaper, never change them."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from rota import Queue
from rota.db import migrate
from rota.fair import ClaimUpkeep, FairClaim

from .oracle import insert_rows, oracle_ids
from .test_fast_claim import recount
from .test_oracle import group_st, job_st

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")

STALE = timedelta(seconds=8)


@pytest.fixture
def no_upkeep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Claims never schedule the background upkeep: the bookkeeping stays as it was."""
    monkeypatch.setattr(ClaimUpkeep, "request", lambda self, job_type: None)


async def upkeep(queue: Queue, conn: Any, type_: str = "t") -> None:
    """One round of the claim upkeep, as of the queue's clock, on ``conn``."""
    await conn.execute(queue.sql("fair/upkeep"), {
        "type": type_, "advance": True, "offset": queue.clock_offset,
        "served_window": queue.served_window})


async def expect_oracle(queue: Queue, aconn: Any, limit: int, type_: str = "t") -> list[int]:
    """Claim through the pool (as production does) and compare with the oracle's ids,
    read just before on another connection (nothing else runs meanwhile)."""
    expected = await oracle_ids(queue, aconn, type_, limit)
    got = [j.id for j in await queue.claim(type_, limit)]
    assert got == expected
    return got


async def lock_goes_stale(queue: Queue) -> None:
    queue.clock_offset += STALE + timedelta(seconds=1)


@pytest.fixture
async def q(make_queue: Any, no_upkeep: None) -> Queue:
    queue: Queue = await make_queue(stale_after=STALE)
    return queue


async def test_stale_running_job_beside_pending_jobs_with_bounds_computed(
    q: Queue, aconn: Any
) -> None:
    await q.upsert_group("g", plan="pro")
    jobs = [await q.enqueue("t", {"n": i}, group_id="g") for i in range(4)]
    [held] = await q.claim("t", 1)  # a process claims the oldest, then dies
    assert held.id == jobs[0].id  # type: ignore[union-attr]
    await upkeep(q, aconn)  # bounds computed now: head is jobs[1]
    await lock_goes_stale(q)
    got = await expect_oracle(q, aconn, 2)
    assert got[0] == held.id


async def test_stale_running_job_of_a_group_with_nothing_pending(
    q: Queue, aconn: Any, schema: str
) -> None:
    await q.upsert_group("g", plan="standard")
    await q.upsert_group("h", plan="standard")
    job = await q.enqueue("t", {}, group_id="g")
    for i in range(3):
        await q.enqueue("t", {"n": i}, group_id="h")
    [held] = await q.claim("t", 1)
    assert held.id == job.id  # type: ignore[union-attr]
    await upkeep(q, aconn)  # g has no pending job left: its row goes or says so
    await lock_goes_stale(q)
    got = await expect_oracle(q, aconn, 4)
    assert held.id in got
    assert await recount(aconn, schema) == []


async def test_stale_running_job_of_a_group_without_any_row(q: Queue, aconn: Any) -> None:
    await q.upsert_group("g", plan="free")
    job = await q.enqueue("t", {}, group_id="g")
    [held] = await q.claim("t", 1)
    await upkeep(q, aconn)
    await upkeep(q, aconn)
    await lock_goes_stale(q)
    assert [j.id for j in await q.claim("t", 5)] == [job.id] == [held.id]  # type: ignore[union-attr]


async def test_stale_job_of_a_paused_group_after_it_resumes(q: Queue, aconn: Any) -> None:
    await q.upsert_group("g", plan="pro")
    await q.upsert_group("h", plan="free")
    g = [await q.enqueue("t", {"n": i}, group_id="g") for i in range(2)]
    h = [await q.enqueue("t", {"n": i}, group_id="h") for i in range(2)]
    [held] = await q.claim("t", 1)
    assert held.id == g[0].id  # type: ignore[union-attr]
    await q.upsert_group("g", plan="pro", active=False)
    await upkeep(q, aconn)
    await lock_goes_stale(q)
    assert [j.id for j in await q.claim("t", 1)] == [h[0].id]  # type: ignore[union-attr]
    await q.upsert_group("g", plan="pro", active=True)
    got = await expect_oracle(q, aconn, 3)
    assert got[0] == held.id


async def test_deferred_job_comes_due_without_upkeep(q: Queue, aconn: Any) -> None:
    await q.upsert_group("g", plan="standard")
    await q.upsert_group("h", plan="standard")
    now = await q.now()
    old = await q.enqueue("t", {"old": True}, group_id="g", run_after=now + timedelta(seconds=30))
    for i in range(3):
        await q.enqueue("t", {"n": i}, group_id="g")
        await q.enqueue("t", {"n": i}, group_id="h")
    await upkeep(q, aconn)
    await expect_oracle(q, aconn, 2)
    q.clock_offset += timedelta(seconds=31)
    got = await expect_oracle(q, aconn, 3)
    assert old.id in got  # type: ignore[union-attr]


async def test_deferred_and_stale_jobs_of_one_group_only(q: Queue, aconn: Any) -> None:
    await q.upsert_group("g", plan="pro")
    now = await q.now()
    a = await q.enqueue("t", {"a": 1}, group_id="g")
    await q.claim("t", 1)
    b = await q.enqueue("t", {"b": 1}, group_id="g", run_after=now + timedelta(seconds=5))
    await upkeep(q, aconn)
    assert await q.claim("t", 5) == []
    await lock_goes_stale(q)
    got = await expect_oracle(q, aconn, 5)
    assert got == [a.id, b.id]  # type: ignore[union-attr]


async def test_claims_on_the_callers_connection_see_the_stale_job(
    q: Queue, aconn: Any, database_url: str
) -> None:
    await q.upsert_group("g", plan="pro")
    for i in range(3):
        await q.enqueue("t", {"n": i}, group_id="g")
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        [held] = await q.claim("t", 1, conn=c)
        await lock_goes_stale(q)
        expected = await oracle_ids(q, aconn, "t", 2)
        got = [j.id for j in await q.claim("t", 2, conn=c)]
    assert got == expected and got[0] == held.id


# -- property: claims after time moves, with the bookkeeping left as it was -------------

async def _timeline(url: str, schema: str, groups: list[tuple[Any, bool]],
                    jobs: list[dict[str, Any]], limit: int, steps: list[tuple[int, bool]],
                    view: bool) -> None:
    """Insert ``jobs`` (times relative to the clock at the start), then for each step
    (seconds forward, run the upkeep first?) move the queue's clock and claim, comparing
    every claim with the oracle. Claims change the jobs (running, attempts + 1), so later
    steps see locks taken earlier go stale, and bounds computed at earlier clocks."""
    queue = Queue(url, schema=schema, stale_after=timedelta(seconds=900),
                  **({"groups": f"{schema}.app_groups"} if view else {}))
    async with await psycopg.AsyncConnection.connect(url) as conn:
        now = sql.SQL("now()")
        await insert_rows(conn, schema, groups, jobs, now)
        for forward, run_upkeep in steps:
            queue.clock_offset += timedelta(seconds=forward)
            if run_upkeep:
                for type_ in ("a", "b"):
                    await upkeep(queue, conn, type_)
            for type_ in ("a", "b"):
                expected = await oracle_ids(queue, conn, type_, limit)
                claimed = await queue.claim(type_, limit, conn=conn)
                assert [c.id for c in claimed] == expected, (forward, run_upkeep, type_)
        await conn.rollback()


@pytest.fixture
def migrated(database_url: str, schema: str) -> str:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
            await migrate(c, schema)
            await c.execute(sql.SQL(
                "CREATE VIEW {s}.app_groups AS SELECT * FROM {s}.groups"
            ).format(s=sql.Identifier(schema)))

    asyncio.run(go())
    return schema


# Forward steps chosen around the stale window (900 s), the jobs' due times (up to 60 s
# ahead) and the served window (1 day).
step_st = st.tuples(st.sampled_from([0, 1, 30, 61, 600, 899, 901, 1000, 3600, 86_401]),
                    st.booleans())


@settings(max_examples=int(__import__("os").environ.get("OVER_TIME_EXAMPLES", 150)), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(group_st, min_size=5, max_size=5),
       jobs=st.lists(job_st, max_size=30),
       limit=st.integers(1, 12),
       steps=st.lists(step_st, min_size=1, max_size=4),
       small_probe=st.booleans(),
       view=st.booleans())
def test_claims_stay_exact_as_time_moves_without_fresh_bookkeeping(
    database_url: str, migrated: str, groups: list[tuple[Any, bool]],
    jobs: list[dict[str, Any]], limit: int, steps: list[tuple[int, bool]],
    small_probe: bool, view: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if small_probe:
        monkeypatch.setattr(FairClaim, "probe_floor", (1, 1))
    asyncio.run(_timeline(database_url, migrated, groups, jobs, limit, steps, view))
