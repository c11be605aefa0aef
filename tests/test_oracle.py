"""Property test: rota's claim hands out exactly the jobs, in exactly the order, of the
naive fair query (the whole fair order in one ORDER BY) with the batch interleave term
of docs/design.md, "The fair claim" (tests/oracle.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from rota import Plan, Plans, Queue

from .helpers import fair_violations
from .oracle import insert_rows, oracle_ids

T = TypeVar("T", bound=Callable[..., None])

PLAN_CHOICES = [None, "free", "standard", "pro", "no-such-plan"]

group_st = st.tuples(st.sampled_from(PLAN_CHOICES), st.booleans())
job_st = st.fixed_dictionaries({
    "group": st.one_of(st.none(), st.integers(0, 5)),  # 5 = a group the table lacks
    "type": st.sampled_from(["a", "b"]),
    "status": st.sampled_from(["pending", "pending", "pending", "running", "done", "failed"]),
    # Ties in created_at, as one statement's jobs have: about half share -20 (ids then
    # decide, across groups); the rest still tie often.
    "created": st.one_of(st.just(-20), st.integers(-40, 0)),
    "run_after": st.integers(-120, 60),
    "locked": st.sampled_from([-5000, -1000, -901, -899, -10]),
    "attempts": st.integers(0, 3),
    # Mostly inside the served window, so groups often share served counts.
    "finished": st.sampled_from([-200_000, -86_401, -86_399, -5_000, -1, -1]),
    # What a running or done job counts (docs/design.md, "Cost"): mostly 1, as when
    # nothing is charged, so served counts still tie often.
    "cost": st.sampled_from(["1", "1", "1", "0.5", "2.25", "10", "0.000001"]),
    # The slot a running job holds (tests/oracle.py, insert_rows): mostly what a capped
    # claim writes, sometimes none or a moved group's.
    "slot": st.sampled_from(["claimed", "claimed", "none", "moved"]),
})


async def _check(url: str, schema: str, groups: list[tuple[Any, ...]],
                 jobs: list[dict[str, Any]], limit: int, offset_s: int, *,
                 probe_floor: tuple[int, int] | None = None, fold_after: int | None = None,
                 expected: str | None = None, **settings: Any) -> None:
    # Its pool is never opened: every call passes conn.
    queue = Queue(url, schema=schema, **settings)
    queue.clock_offset = timedelta(seconds=offset_s)
    queue.fair_claim.probe_floor = probe_floor  # (1, 1): the walk cut after 2 groups a plan
    async with await psycopg.AsyncConnection.connect(url) as conn:
        now = sql.SQL("(now() + {}::interval)").format(sql.Literal(queue.clock_offset))
        if expected is not None:  # the types' expected cost: a position counts in it
            await conn.execute(sql.SQL("INSERT INTO {}.fair_costs (type, expected)"
                                       " VALUES ('a', %s), ('b', %s)").format(
                sql.Identifier(schema)), [expected, expected])
        if fold_after is None:
            await insert_rows(conn, schema, groups, jobs, now)
        else:
            # The first jobs folded into the bookkeeping (served counts, bounds, owners'
            # rows), the rest written after: the claim reads both kinds.
            await insert_rows(conn, schema, groups, jobs[:fold_after], now)
            for type_ in ("a", "b"):
                await conn.execute(sql.SQL("SELECT {s}.fair_fold(%s, {now})").format(
                    s=sql.Identifier(schema), now=now), [type_])
            await insert_rows(conn, schema, [], jobs[fold_after:], now)
        for type_ in ("a", "b"):
            expected = await oracle_ids(queue, conn, type_, limit)
            claimed = await queue.claim(type_, limit, conn=conn)
            assert [c.id for c in claimed] == expected
            assert all(c.status == "running" for c in claimed)
        # The triggers kept the bookkeeping of the rows written and the claims made.
        assert [str(v) for v in await fair_violations(conn, schema)] == []
        await conn.rollback()


def oracle_examples(max_examples: int,
                    offsets: tuple[int, ...] = (0, 3600, 90_000)) -> Callable[[T], T]:
    """The hypothesis settings and arguments of a test that runs `_check`: five groups, up
    to 30 jobs, a claim limit and a clock offset (seconds) drawn from ``offsets``."""

    def decorate(test: T) -> T:
        test = given(groups=st.lists(group_st, min_size=5, max_size=5),
                     jobs=st.lists(job_st, max_size=30),
                     limit=st.integers(1, 12),
                     offset_s=st.sampled_from(offsets))(test)
        return settings(max_examples=max_examples, deadline=None,
                        suppress_health_check=[HealthCheck.function_scoped_fixture])(test)

    return decorate


@oracle_examples(150)
def test_claim_matches_the_posts_query_with_interleave(
    database_url: str, migrated: str, groups: list[tuple[Any, bool]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int,
) -> None:
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s))


# Plans that share a priority by weight (standard 2, pro 3), under free; owners o0..o2
# and groups without one; group 6 is missing from the table.
WEIGHTED = Plans([Plan("free", "Free", 0), Plan("standard", "Standard", 1, weight=2),
                  Plan("pro", "Pro", 1, weight=3)])
owned_group_st = st.tuples(st.sampled_from(PLAN_CHOICES), st.booleans(),
                           st.sampled_from([None, "o0", "o1", "o1", "o2"]))
owned_job_st = job_st.map(lambda j: j).flatmap(
    lambda j: st.integers(0, 6).map(lambda g: {**j, "group": g if j["group"] is not None
                                                else None}))


def owned_examples(max_examples: int) -> Callable[[T], T]:
    """Like :func:`oracle_examples`, with six groups that have owners (several groups an
    owner, some none), a group the table lacks, up to 40 jobs, and both orders."""

    def decorate(test: T) -> T:
        test = given(groups=st.lists(owned_group_st, min_size=6, max_size=6),
                     jobs=st.lists(owned_job_st, max_size=40),
                     limit=st.integers(1, 12),
                     offset_s=st.sampled_from((0, 3600, 90_000)),
                     fair_by=st.sampled_from(["group", "owner"]),
                     fold_after=st.one_of(st.none(), st.integers(0, 40)),
                     expected=st.sampled_from([None, "1", "2.5", "0.5", "100"]))(test)
        return settings(max_examples=max_examples, deadline=None,
                        suppress_health_check=[HealthCheck.function_scoped_fixture])(test)

    return decorate


@owned_examples(150)
def test_claim_matches_the_naive_query_with_owners_and_weights(
    database_url: str, migrated: str, groups: list[tuple[Any, ...]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int, fair_by: str,
    fold_after: int | None, expected: str | None,
) -> None:
    """Owners with several groups, plans that share a priority by weight, under both
    orders (docs/design.md, "The fair claim"), some jobs folded before the rest."""
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s,
                       plans=WEIGHTED, fair_by=fair_by, fold_after=fold_after,
                       expected=expected))


@owned_examples(100)
def test_claim_matches_the_naive_query_with_owners_and_the_smallest_probe(
    database_url: str, migrated: str, groups: list[tuple[Any, ...]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int, fair_by: str,
    fold_after: int | None, expected: str | None,
) -> None:
    """A probe of one owner (group), one group an owner and one job a group: every cut
    falls inside an owner, and the retries widen the probe until the batch is proven."""
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s,
                       plans=WEIGHTED, fair_by=fair_by, probe_floor=(1, 1),
                       fold_after=fold_after, expected=expected))


# Plans whose levels the owner walk reads by priority and stops (docs/fast-claim.md,
# "The owner level", step 2): three priorities; a gap where groups without a plan rank
# at a priority of their own, one plan capped; two plans tied at the lowest priority.
DISTINCT = Plans([Plan("free", "Free", 0), Plan("standard", "Standard", 1, weight=2),
                  Plan("pro", "Pro", 2, weight=3)])
GAP = Plans([Plan("free", "Free", 0), Plan("x", "X", 1),
             Plan("standard", "Standard", 2, weight=2, max_running=2),
             Plan("pro", "Pro", 3, weight=3)])
TIED = Plans([Plan("free", "Free", 0, weight=5), Plan("standard", "Standard", 0, weight=2),
              Plan("pro", "Pro", 4, weight=3)])


@given(groups=st.lists(owned_group_st, min_size=6, max_size=6),
       jobs=st.lists(owned_job_st, max_size=40), limit=st.integers(1, 12),
       offset_s=st.sampled_from((0, 3600, 90_000)),
       plans=st.sampled_from([DISTINCT, GAP, TIED]),
       probe_floor=st.sampled_from([None, (1, 1), (2, 1), (3, 2)]),
       fold_after=st.one_of(st.none(), st.integers(0, 40)))
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_claim_matches_the_naive_query_with_owners_over_plans_of_many_priorities(
    database_url: str, migrated: str, groups: list[tuple[Any, ...]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int, plans: Plans,
    probe_floor: tuple[int, int] | None, fold_after: int | None,
) -> None:
    """The owner walk stops at the levels it can reach, whatever the probe, the plans'
    priorities and weights, a cap, and the owners left special (not folded)."""
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s,
                       plans=plans, fair_by="owner", probe_floor=probe_floor,
                       fold_after=fold_after))


CAPPED = Plans([Plan("free", "Free", 0, max_running=1),
                Plan("standard", "Standard", 1, weight=2, max_running=2),
                Plan("pro", "Pro", 1, weight=3)])


@owned_examples(150)
def test_claim_matches_the_naive_query_with_owners_capped(
    database_url: str, migrated: str, groups: list[tuple[Any, ...]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int, fair_by: str,
    fold_after: int | None, expected: str | None,
) -> None:
    """Plans that cap their owners' running jobs (docs/design.md, "Caps"): the claim
    takes the naive order's jobs, passing over those of an owner whose fresh running
    jobs (every type) and the ones taken so far reach its cap; stale locks hold none."""
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s,
                       plans=CAPPED, fair_by=fair_by, fold_after=fold_after,
                       expected=expected))


@owned_examples(100)
def test_claim_matches_the_naive_query_with_owners_capped_and_the_smallest_probe(
    database_url: str, migrated: str, groups: list[tuple[Any, ...]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int, fair_by: str,
    fold_after: int | None, expected: str | None,
) -> None:
    """Caps with a probe of one owner (group) and one job: every bound the caps drop or
    keep is tried (cap_tail_on.sql)."""
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s,
                       plans=CAPPED, fair_by=fair_by, probe_floor=(1, 1),
                       fold_after=fold_after, expected=expected))


# Deep backlogs of capped owners: group 0 (owner o0) holds a long backlog of pending jobs
# and no served count; the other groups have a few pending jobs and done jobs that cost
# 10 each, so served counts put their jobs after many of o0's in the order.
deep_job_st = st.fixed_dictionaries({
    "group": st.just(0),
    "type": st.just("a"),
    "status": st.just("pending"),
    "created": st.integers(-40, 0),
    "run_after": st.sampled_from([-60, -60, -60, -60, -60, 30]),
    "locked": st.just(-10),
    "attempts": st.just(0),
    "finished": st.just(-1),
    "cost": st.just("1"),
})
other_job_st = st.fixed_dictionaries({
    "group": st.integers(1, 4),
    "type": st.just("a"),
    "status": st.sampled_from(["pending", "done", "done", "running"]),
    "created": st.integers(-40, 0),
    "run_after": st.just(-60),
    "locked": st.sampled_from([-5000, -10]),
    "attempts": st.just(0),
    "finished": st.just(-1),
    "cost": st.sampled_from(["1", "10", "10"]),
})


@given(deep=st.lists(deep_job_st, min_size=30, max_size=55),
       others=st.lists(other_job_st, max_size=20), limit=st.integers(2, 5),
       fair_by=st.sampled_from(["group", "owner"]),
       third=st.sampled_from([("free", "o2"), ("standard", "o2"), ("pro", "o3")]),
       capped=st.booleans())
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_claim_matches_the_naive_query_with_owners_capped_and_every_job_read(
    database_url: str, migrated: str, deep: list[dict[str, Any]],
    others: list[dict[str, Any]], limit: int, fair_by: str, third: tuple[str, str],
    capped: bool,
) -> None:
    """Caps with a probe that reads every job (8 groups, 60 jobs a group) over a deep
    backlog of a capped owner: more jobs are read than there are candidates, so the
    first job past them is a bound, and the caps pass many candidates over (o0, and o1
    with two groups, capped at 1; the fourth group o2's on the same plan, or on
    standard, capped at 2, or o3's on pro, not capped; group 4 without an owner, capped
    at 1 as its own owner); and the same work with the plans uncapped."""
    groups = [("free", True, "o0"), ("free", True, "o1"), ("free", True, "o1"),
              (third[0], True, third[1]), ("free", True, None)]
    jobs = deep + others
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, 0,
                       plans=CAPPED if capped else WEIGHTED, fair_by=fair_by,
                       probe_floor=(8, 60)))

@pytest.mark.parametrize("fair_by", ["group", "owner"])
def test_a_capped_owners_bound_past_the_candidates_still_bounds_the_other_owners_jobs(
    database_url: str, migrated: str, fair_by: str,
) -> None:
    """The first job read past the candidates bounds every job read after it, of every
    owner: it is no one owner's bound, so a capped owner's used allowance never drops it
    (cap_tail_on.sql). Owner o0 (capped at 1) has 30 jobs, o1 (capped at 1) one job whose
    group has been served 30 times; the probe reads every job (40 a group), so the claim
    of 2 has 25 of o0's jobs as its candidates and the 26th, o0's too, past them. o0's
    first job is taken and its 24 others passed over: the batch is o0's first job and
    o1's job, as the naive query walked with the allowances says, not o0's alone."""
    base = {"type": "a", "run_after": -60, "locked": -10, "attempts": 0, "finished": -1,
            "cost": "1"}
    jobs = ([{**base, "group": 0, "status": "pending", "created": -30 + i} for i in range(30)]
            + [{**base, "group": 1, "status": "pending", "created": -40}]
            + [{**base, "group": 1, "status": "done", "created": -50} for _ in range(30)])
    asyncio.run(_check(database_url, migrated, [("free", True, "o0"), ("free", True, "o1")],
                       jobs, 2, 0, plans=CAPPED, probe_floor=(8, 40), fair_by=fair_by))


# Wide and deep: nine groups over four owners (two with three groups) and a group
# without one, on plans of two priorities and two weights, capped or not; up to 90
# jobs, mostly pending, in groups whose done jobs cost 1 or 10.
wide_group_st = st.tuples(st.sampled_from(["free", "standard", "pro"]), st.just(True),
                          st.sampled_from(["o0", "o0", "o1", "o1", "o2", "o3", None]))
wide_job_st = st.fixed_dictionaries({
    "group": st.integers(0, 8),
    "type": st.just("a"),
    "status": st.sampled_from(["pending", "pending", "pending", "pending", "done",
                               "running"]),
    "created": st.one_of(st.just(-20), st.integers(-60, 0)),
    "run_after": st.sampled_from([-60, -60, -60, 30]),
    "locked": st.sampled_from([-5000, -10]),
    "attempts": st.just(0),
    "finished": st.sampled_from([-5_000, -1]),
    "cost": st.sampled_from(["1", "1", "10"]),
})


@given(groups=st.lists(wide_group_st, min_size=9, max_size=9),
       jobs=st.lists(wide_job_st, min_size=20, max_size=90), limit=st.integers(1, 12),
       fair_by=st.sampled_from(["group", "owner"]), capped=st.booleans(),
       probe_floor=st.sampled_from([(1, 1), (2, 1), (8, 60)]),
       expected=st.sampled_from([None, "1", "4", "0.5"]))
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_claim_matches_the_naive_query_over_wide_and_deep_backlogs(
    database_url: str, migrated: str, groups: list[tuple[Any, ...]],
    jobs: list[dict[str, Any]], limit: int, fair_by: str, capped: bool,
    probe_floor: tuple[int, int], expected: str | None,
) -> None:
    """Owners with several deep groups, served counts far apart, the smallest probe (every
    cut, spread and retry tried), a probe of two owners, and one that reads every job
    (the bound past the candidates), by group and by owner, capped and not."""
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, 0,
                       plans=CAPPED if capped else WEIGHTED, fair_by=fair_by,
                       probe_floor=probe_floor, expected=expected))


# Groups of rota's own groups table capped at 1 to 3 running jobs (groups.max_running;
# docs/design.md, "Caps"), some not, with owners as owned_group_st's.
group_capped_st = st.tuples(st.sampled_from(PLAN_CHOICES), st.booleans(),
                            st.sampled_from([None, "o0", "o1", "o1", "o2"]),
                            st.sampled_from([None, None, 1, 2, 3]))


@given(groups=st.lists(group_capped_st, min_size=6, max_size=6),
       jobs=st.lists(owned_job_st, max_size=40), limit=st.integers(1, 12),
       offset_s=st.sampled_from((0, 3600, 90_000)),
       fair_by=st.sampled_from(["group", "owner"]), plans_capped=st.booleans(),
       probe_floor=st.sampled_from([None, (1, 1), (8, 60)]),
       fold_after=st.one_of(st.none(), st.integers(0, 40)))
@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_claim_matches_the_naive_query_with_groups_capped(
    database_url: str, migrated: str, groups: list[tuple[Any, ...]],
    jobs: list[dict[str, Any]], limit: int, offset_s: int, fair_by: str,
    plans_capped: bool, probe_floor: tuple[int, int] | None,
    fold_after: int | None,
) -> None:
    """Groups capped on their own (groups.max_running): the claim takes the naive
    order's jobs, passing over those of a group whose fresh running jobs (every type:
    type a's claim counts in type b's) and the ones taken so far reach its cap, and
    those of a capped owner at its own (the plans capped, or not: the uncapped
    statement's guard sends the claim to the capped one); with the smallest probe (every
    bound the group stage drops or keeps) and one that reads every job (the bound past
    the candidates), by group and by owner."""
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, offset_s,
                       plans=CAPPED if plans_capped else WEIGHTED, fair_by=fair_by,
                       probe_floor=probe_floor,
                       fold_after=fold_after))


@given(groups=st.lists(st.tuples(st.sampled_from(["free", "standard", "pro"]), st.just(True),
                                 st.sampled_from(["o0", "o0", "o1", "o1", "o2", None]),
                                 st.sampled_from([None, 1, 2, 3])),
                       min_size=9, max_size=9),
       jobs=st.lists(wide_job_st, min_size=20, max_size=90), limit=st.integers(1, 12),
       fair_by=st.sampled_from(["group", "owner"]), plans_capped=st.booleans(),
       probe_floor=st.sampled_from([(1, 1), (2, 1), (8, 60)]))
@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_claim_matches_the_naive_query_over_wide_and_deep_backlogs_with_groups_capped(
    database_url: str, migrated: str, groups: list[tuple[Any, ...]],
    jobs: list[dict[str, Any]], limit: int, fair_by: str, plans_capped: bool,
    probe_floor: tuple[int, int],
) -> None:
    """Deep groups capped on their own at 1 to 3, owners with several of them, capped
    plans or not: the group stage passes many candidates over, and the proof keeps every
    bound but a capped group's own next job once its allowance is used."""
    asyncio.run(_check(database_url, migrated, groups, jobs, limit, 0,
                       plans=CAPPED if plans_capped else WEIGHTED, fair_by=fair_by,
                       probe_floor=probe_floor))
