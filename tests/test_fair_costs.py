"""Fair by what the work costs (docs/design.md, "Cost"): a job counts its cost in its
group's and owner's served counts, the cost its handler charged once done and its
type's expected cost while it runs; bad charges are refused and write nothing."""

from __future__ import annotations

import asyncio
import math
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import InvalidCharge, InvalidInput, Queue
from rota.cost import MAX_COST
from rota.fair.upkeep import UpkeepConfig

from .oracle import oracle_ids
from .test_fast_claim import claim_equals_oracle

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")

#: What each owner's jobs charge in the example: H ten times what L does.
CHARGE = {"H": 10, "L": 1}


async def h_and_l(queue: Queue, jobs: int = 300) -> None:
    """Owners H and L on one plan, one group each, both backlogged (H's jobs first)."""
    for owner in ("H", "L"):
        await queue.upsert_group(owner.lower(), plan="pro", owner_id=owner)
    for owner in ("H", "L"):
        await queue.enqueue_many([{"type": "t", "payload": {"o": owner},
                                   "group_id": owner.lower()} for _ in range(jobs)])


async def drain_charged(queue: Queue, url: str, jobs: int) -> list[dict[str, int]]:
    """One claimer, claims of 10, each job completed with its owner's charge, until
    ``jobs`` jobs have run; every claim is checked against the oracle first. Returns the
    units charged per owner after each claim."""
    charged = {"H": 0, "L": 0}
    after: list[dict[str, int]] = []
    while len(after) * 10 < jobs:
        await claim_equals_oracle(queue, url, "t", 10)
        batch = await queue.claim("t", 10)
        assert len(batch) == 10
        costs = [CHARGE[j.payload["o"]] for j in batch]
        assert await queue.complete_many(batch, costs=costs) == [True] * len(batch)
        for j in batch:
            charged[j.payload["o"]] += CHARGE[j.payload["o"]]
        after.append(dict(charged))
    return after


@pytest.mark.parametrize("fair_by", ["group", "owner"])
async def test_owners_are_charged_alike_when_one_owners_jobs_cost_ten_times_more(
        make_queue: Any, database_url: str, fair_by: str) -> None:
    """H's jobs charge 10, L's 1; one claimer, claims of 10. After the first 220 jobs H
    and L have each been charged 200 units: L has run ten times as many jobs (200
    against 20). Counting jobs instead, each would have run 110 (H 1,100 units, L 110).
    On the way the two never differ by more than 50 units: the batch interleave hands
    out a claim of 10 as H, L, H, L... when their served counts tie, so H takes 5 jobs
    (50 units) at once."""
    queue = await make_queue(fair_by=fair_by)
    # One fold at the first claim (nothing done yet), then none: the type's expected
    # cost stays 1 (a position counts 1), so the figures are exact and the oracle and
    # the claim read the same one.
    queue.upkeep.config = UpkeepConfig(every=3600)
    await h_and_l(queue)
    after = await drain_charged(queue, database_url, 220)
    assert after[-1] == {"H": 200, "L": 200}
    assert max(abs(c["H"] - c["L"]) for c in after) == 45
    assert after[:2] == [{"H": 50, "L": 5}, {"H": 50, "L": 15}]


async def test_a_job_counts_its_types_expected_cost_while_it_runs(
        make_queue: Any, database_url: str) -> None:
    """Once the upkeep has folded completions that charged 3 each, the type's expected
    cost is 3: a job claimed then counts 3 while it runs, and what it is charged when it
    completes (5), the contract checked at each step."""
    queue = await make_queue()
    await h_and_l(queue, jobs=20)
    first = await queue.claim("t", 10)
    assert [j.cost for j in first] == [Decimal(1)] * 10  # nothing done yet: 1
    assert await queue.complete_many(first, costs=[3] * 10) == [True] * 10
    # Folded: by the upkeep's loop, stopped here (it waits for its round), or now.
    await queue.upkeep.stop()
    await queue.upkeep.run_once()
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        s = sql.Identifier(queue.schema)
        cur = await conn.execute(sql.SQL("SELECT expected FROM {}.fair_costs"
                                         " WHERE type = 't'").format(s))
        assert await cur.fetchall() == [(Decimal("3.000000"),)]
    job, = await queue.claim("t", 1)
    assert job.cost == Decimal(3)
    assert await served_of(queue, database_url, job.group_id) == 15 + 3  # 5 done + 1 running
    assert await queue.complete(job, cost=5.5)
    assert await served_of(queue, database_url, job.group_id) == Decimal("20.5")
    done = await queue.get_job(job.id)
    assert done.cost == Decimal("5.5")


async def served_of(queue: Queue, url: str, group: str | None) -> Decimal:
    """The group's served count as the claim sees it: the cost of its running jobs and
    of its done jobs in the window, read from jobs (the contract checks the rest)."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(sql.SQL(
            "SELECT coalesce(sum(cost), 0) FROM {}.jobs"
            " WHERE group_id = %s AND status IN ('running', 'done')").format(
            sql.Identifier(queue.schema)), [group])
        row = await cur.fetchone()
    assert row is not None
    return Decimal(row[0])


async def test_nothing_charged_costs_one_and_charges_round_to_six_places(
        make_queue: Any) -> None:
    queue = await make_queue()
    await h_and_l(queue, jobs=3)
    a, b, c = await queue.claim("t", 3)
    assert await queue.complete(a)
    assert await queue.complete(b, cost=0.1 + 0.2)  # 0.30000000000000004
    assert await queue.complete(c, cost=1e-9)  # below the smallest step: counts one step
    got = [(await queue.get_job(j.id)).cost for j in (a, b, c)]
    assert got == [Decimal(1), Decimal("0.300000"), Decimal("0.000001")]


BAD_CHARGES = [
    (0, "more than 0"), (-1, "more than 0"), (math.nan, "finite"), (math.inf, "finite"),
    (-math.inf, "finite"), (Decimal("NaN"), "finite"), (True, "got bool"),
    ("5", "got str"), ([1], "got list"),
    (MAX_COST + 1, "more than one job may cost (1,000,000,000)"), (1e300, "more than one"),
]


@pytest.mark.parametrize("charge, says", BAD_CHARGES,
                         ids=[repr(c)[:20] for c, _ in BAD_CHARGES])
async def test_a_bad_charge_is_refused_and_writes_nothing(
        make_queue: Any, charge: Any, says: str) -> None:
    queue = await make_queue()
    await h_and_l(queue, jobs=2)
    a, b = await queue.claim("t", 2)
    with pytest.raises(InvalidCharge, match=r"charge") as e:
        await queue.complete(a, cost=charge)
    assert says in str(e.value)
    with pytest.raises(InvalidCharge):
        await queue.complete_many([a, b], costs=[1, charge])
    # Nothing was written: both still run under their claims, and complete as usual.
    assert [(await queue.get_job(j.id)).status for j in (a, b)] == ["running", "running"]
    assert await queue.complete_many([a, b], costs=[2, None]) == [True, True]


async def test_complete_many_wants_one_cost_per_job(make_queue: Any) -> None:
    queue = await make_queue()
    await h_and_l(queue, jobs=2)
    jobs = await queue.claim("t", 2)
    with pytest.raises(InvalidInput, match="1 costs for 2 jobs"):
        await queue.complete_many(jobs, costs=[1])


@pytest.mark.parametrize("cost", ["tokens", "", None, 1, "Seconds"])
def test_a_stage_cost_other_than_units_or_seconds_is_one_clear_error(cost: Any) -> None:
    from rota import Stage

    async def handler(ctx: Any) -> None: ...

    with pytest.raises(InvalidInput, match=r"^stage 't': cost must be one of 'units', "
                                           r"'seconds', got "):
        Stage("t", handler=handler, cost=cost)


# -- charged by handlers, through the runner (docs/design.md, "Cost") ----------------------


async def costs_of(queue: Queue, ids: list[int]) -> list[Decimal]:
    return [(await queue.get_job(i)).cost for i in ids]


async def test_a_handler_charges_its_job_and_charges_add_up(queue: Queue) -> None:
    from rota import JobContext, Pipeline, Stage

    async def handler(ctx: JobContext) -> None:
        for units in ctx.job.payload["charges"]:
            ctx.charge(units)

    def sync_handler(ctx: JobContext) -> None:  # in a thread of its own
        ctx.charge(7.5)

    ids = [(await queue.enqueue("t", {"charges": c})).id
           for c in ([10], [0.25, 0.5], [], [1e-7])]
    ids.append((await queue.enqueue("s", {})).id)
    result = await Pipeline(queue, [Stage("t", 4, 4, handler),
                                    Stage("s", handler=sync_handler)]).run(trigger="manual")
    assert (result.stop_reason, result.jobs_done) == ("no_work", 5)
    assert await costs_of(queue, ids) == [Decimal(10), Decimal("0.75"), Decimal(1),
                                          Decimal("0.000001"), Decimal("7.5")]


async def test_a_job_that_completes_itself_is_charged_what_it_charged_before(
        queue: Queue) -> None:
    from rota import JobContext, Pipeline, Stage

    async def handler(ctx: JobContext) -> None:
        ctx.charge(3)
        async with queue.connection() as c:
            assert await ctx.complete(conn=c)

    job = await queue.enqueue("t", {})
    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run(trigger="manual")
    assert result.jobs_done == 1
    assert await costs_of(queue, [job.id]) == [Decimal(3)]


async def test_a_stage_charging_seconds_charges_each_jobs_run_time(queue: Queue) -> None:
    """cost="seconds": a handler that sleeps 0.3 s is charged about 0.3 plus what it
    charged; a batch handler's call is shared evenly by its 4 jobs."""
    from rota import JobContext, Pipeline, Stage

    async def handler(ctx: JobContext) -> None:
        await asyncio.sleep(0.3)
        ctx.charge(ctx.job.payload["plus"])

    async def batch(ctxs: list[JobContext]) -> None:
        await asyncio.sleep(0.4)

    one = (await queue.enqueue("t", {"plus": 2})).id
    four = [(await queue.enqueue("b", {})).id for _ in range(4)]
    await Pipeline(queue, [Stage("t", 1, 1, handler, cost="seconds"),
                           Stage("b", 4, batch_handler=batch, cost="seconds")]
                   ).run(trigger="manual")
    [t] = await costs_of(queue, [one])
    assert Decimal("2.3") <= t < Decimal("2.8"), t
    shares = await costs_of(queue, four)
    assert len(set(shares)) == 1 and Decimal("0.1") <= shares[0] < Decimal("0.2"), shares


@pytest.mark.parametrize("charge", [0, -3, math.nan, math.inf, True, "5", MAX_COST + 1])
async def test_a_bad_charge_fails_that_attempt_never_the_run(queue: Queue, charge: Any) -> None:
    from rota import JobContext, Pipeline, Stage

    async def handler(ctx: JobContext) -> None:
        ctx.charge(2)
        ctx.charge(charge)

    pipeline = Pipeline(queue, [Stage("t", 1, 1, handler, max_attempts=1)])
    job = await pipeline.queue.enqueue("t", {})  # the stage's max_attempts applies
    result = await pipeline.run(trigger="manual")
    assert (result.stop_reason, result.jobs_done, result.jobs_failed) == ("no_work", 0, 1)
    failed = await queue.get_job(job.id)
    assert failed.status == "failed"
    assert failed.last_error is not None and failed.last_error.startswith("InvalidCharge: ")


async def test_charges_past_the_limit_in_total_are_refused(queue: Queue) -> None:
    from rota import JobContext, Pipeline, Stage
    seen: list[str] = []

    async def handler(ctx: JobContext) -> None:
        ctx.charge(MAX_COST)
        try:
            ctx.charge(1)
        except InvalidCharge as e:
            seen.append(str(e))

    job = await queue.enqueue("t", {})
    await Pipeline(queue, [Stage("t", 1, 1, handler)]).run(trigger="manual")
    assert seen == ["the charges of one job add up to 1000000001 units, more than one job "
                    "may cost (1,000,000,000)"]
    assert await costs_of(queue, [job.id]) == [Decimal(MAX_COST)]


async def test_a_seconds_stage_job_charged_the_limit_is_capped_and_the_others_complete(
        queue: Queue) -> None:
    """cost="seconds": a charge of the whole limit passes its check, and the measured
    seconds on top would go past it: that job costs the limit, and the jobs completed
    beside it in the same group commit are done, charged their own (the run ends
    no_work, never error)."""
    from rota import JobContext, Pipeline, Stage

    async def handler(ctx: JobContext) -> None:
        await asyncio.sleep(0.05)
        ctx.charge(MAX_COST if ctx.job.payload["big"] else 1)

    ids = [(await queue.enqueue("p", {"big": i == 3})).id for i in range(4)]
    result = await Pipeline(queue, [Stage("p", 4, 4, handler, cost="seconds")]
                            ).run(trigger="manual")
    assert (result.stop_reason, result.jobs_done) == ("no_work", 4)
    costs = await costs_of(queue, ids)
    assert costs[3] == Decimal(MAX_COST)
    assert all(Decimal("1.05") <= c < Decimal("1.5") for c in costs[:3]), costs


async def test_a_charge_after_the_job_completed_itself_is_refused(queue: Queue) -> None:
    from rota import JobContext, Pipeline, Stage
    seen: list[str] = []

    async def handler(ctx: JobContext) -> None:
        ctx.charge(5)
        assert await ctx.complete()
        try:
            ctx.charge(7)
        except InvalidCharge as e:
            seen.append(str(e))

    job = await queue.enqueue("t", {})
    await Pipeline(queue, [Stage("t", 1, 1, handler)]).run(trigger="manual")
    assert seen == [f"job {job.id} is already settled: a charge after ctx.complete() "
                    f"would be lost (charge before it)"]
    assert await costs_of(queue, [job.id]) == [Decimal(5)]


async def test_costs_given_as_a_string_is_one_clear_error(queue: Queue) -> None:
    await queue.enqueue("t", {})
    jobs = await queue.claim("t", 1)
    with pytest.raises(InvalidInput, match="^complete_many: costs must be a sequence of "
                                           "numbers \\(one a job\\), got str$"):
        await queue.complete_many(jobs, costs="1")


async def test_a_cut_groups_next_job_is_bounded_in_the_expected_cost(
        database_url: str, migrated: str) -> None:
    """The probe's bound of a cut group's next job counts its position in the type's
    expected cost (here 0.5: keys A 0, 0.5, 1.0; B 0.8, 1.3; C 1.2). Probing 2 jobs a
    group leaves A's third unread; its bound (1.0, not 2.0) is below the 4th candidate
    (C's 1.2), so the claim reads on and takes it: A, A, B, A."""
    s = sql.Identifier(migrated)
    queue = Queue(database_url, schema=migrated)  # never opened: no upkeep folds here
    queue.fair_claim.probe_floor = (1, 1)
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        await conn.execute(sql.SQL("INSERT INTO {}.fair_costs VALUES ('t', 0.5)").format(s))
        for g in "ABC":
            await conn.execute(sql.SQL("INSERT INTO {}.groups (group_id, plan) VALUES"
                                       " (%s, 'pro')").format(s), [g])
        for g, cost in (("B", "0.8"), ("C", "1.2")):  # their served counts
            await conn.execute(sql.SQL(
                "INSERT INTO {}.jobs (type, group_id, payload, status, max_attempts,"
                " run_after, created_at, finished_at, cost) VALUES ('t', %s, '{{}}',"
                " 'done', 3, now(), now(), now(), %s)").format(s), [g, cost])
        ids = {}
        for name, g in (("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B"),
                        ("c1", "C")):
            cur = await conn.execute(sql.SQL(
                "INSERT INTO {}.jobs (type, group_id, payload, max_attempts, run_after,"
                " created_at) VALUES ('t', %s, '{{}}', 3, now() - interval '1 minute',"
                " now() - interval '1 minute') RETURNING id").format(s), [g])
            row = await cur.fetchone()
            assert row is not None
            ids[row[0]] = name
        expected = await oracle_ids(queue, conn, "t", 4)
        claimed = await queue.claim("t", 4, conn=conn)
        await conn.rollback()
    assert [ids[i] for i in expected] == ["a1", "a2", "b1", "a3"]
    assert [ids[j.id] for j in claimed] == ["a1", "a2", "b1", "a3"]
