"""Fair by what the work costs (docs/design.md, "Cost"): a job counts its cost in its
group's and owner's served counts, the cost its handler charged once done and its
type's expected cost while it runs; bad charges are refused and write nothing."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import InvalidCharge, InvalidInput, Queue
from rota.cost import MAX_COST

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
