"""Rate limits shared by every worker (docs/design.md, "Rates"): the bucket's exact
spacing, bursts, spending after the fact, backoffs and keys, checked on the queue's
clock (``clock_offset``), never by sleeping; the runner's deferral; and a fleet of real
worker processes against one limit."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import math
import os
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from rota import Pipeline, Queue, RateLimit, RateLimited, Stage, db
from rota.cli import cli
from rota.errors import ConfigError, InvalidInput
from rota.rates import rate_states
from rota.runner import JobContext

from .conftest import ROOT
from .helpers import enqueue_jobs

SECOND = timedelta(seconds=1)


async def refused(limit: RateLimit, queue: Queue, units: int = 1, key: str = "") -> Any:
    with pytest.raises(RateLimited) as info:
        await limit.take(queue, units, key=key, max_wait=timedelta(0))
    return info.value


# -- the bucket ------------------------------------------------------------------------


async def test_takes_are_spaced_by_the_emission_interval(queue: Queue) -> None:
    limit = RateLimit("api", 20, SECOND)
    assert limit.emission == timedelta(milliseconds=50)
    first = await limit.take(queue)
    assert first.wait == timedelta(0)
    # The second unit is there exactly one emission interval after the first.
    no = await refused(limit, queue)
    assert no.free_at == first.at + timedelta(milliseconds=50)
    assert (no.limit, no.key, no.units) == ("api", "", 1)
    # Within max_wait it is a reservation: the instant is the taker's.
    second = await limit.take(queue, max_wait=SECOND)
    assert second.at == first.at + timedelta(milliseconds=50)
    third = await limit.take(queue, max_wait=SECOND)
    assert third.at == first.at + timedelta(milliseconds=100)


async def test_the_emission_interval_rounds_up_so_no_period_holds_more() -> None:
    assert RateLimit("a", 7, timedelta(minutes=1)).emission == timedelta(
        microseconds=8_571_429)
    assert RateLimit("a", 3, SECOND).emission == timedelta(microseconds=333_334)


async def test_a_burst_goes_at_once_then_the_rate_applies(queue: Queue) -> None:
    limit = RateLimit("api", 10, SECOND, burst=4)
    grants = [await limit.take(queue, max_wait=timedelta(0)) for _ in range(4)]
    assert [g.wait for g in grants] == [timedelta(0)] * 4
    no = await refused(limit, queue)
    # Four units left a full bucket: the next is there one interval after the first.
    assert no.free_at == grants[0].at + timedelta(milliseconds=100)


async def test_more_units_than_the_burst_only_after_the_fact(queue: Queue) -> None:
    limit = RateLimit("tokens", 100, timedelta(minutes=1), burst=10)
    with pytest.raises(InvalidInput, match="burst 10"):
        await limit.take(queue, 11)
    assert (await limit.take(queue, 11, after=True)).wait == timedelta(0)


async def test_spending_after_the_fact_drives_the_bucket_negative(queue: Queue) -> None:
    limit = RateLimit("tokens", 10, SECOND)  # a unit every 100 ms
    spent = await limit.take(queue, 30, after=True)
    [state] = await rate_states(queue)
    # 30 units below a full bucket (1), less what refilled between the spend and the read.
    refilled = (state.now - spent.at) / timedelta(milliseconds=100)
    assert state.available == pytest.approx(1 - 30 + refilled, abs=1e-6)
    assert state.available < 0
    assert state.next_free == spent.at + timedelta(seconds=3)
    assert state.taken == 30
    # The next unit is there once all 30 are paid back: 3 s after the spend.
    no = await refused(limit, queue)
    assert no.free_at == spent.at + timedelta(seconds=3)
    queue.clock_offset = timedelta(seconds=2.9)
    assert (await refused(limit, queue)).free_at == no.free_at
    queue.clock_offset = timedelta(seconds=3)
    assert (await limit.take(queue, max_wait=timedelta(0))).wait == timedelta(0)


async def test_a_backoff_holds_every_taker_off_until_it_ends(queue: Queue) -> None:
    # One unit a second, and the clock moved a second short of the backoff's end: the
    # wall time the test itself takes (a loaded machine's tens of milliseconds) cannot
    # carry a take past either (a 10 ms interval and 0.1 s short of the end did).
    limit = RateLimit("api", 1, SECOND)
    until = await limit.backoff(queue, 30)
    no = await refused(limit, queue)
    assert no.free_at == until
    # A shorter backoff does not shorten it.
    assert await limit.backoff(queue, timedelta(seconds=5)) == until
    queue.clock_offset = timedelta(seconds=29)
    assert (await refused(limit, queue)).free_at == until
    queue.clock_offset = timedelta(seconds=30)
    taken = await limit.take(queue, max_wait=timedelta(0))
    assert taken.wait == timedelta(0) and taken.at >= until
    # It ends without a burst: the next unit is one interval later.
    assert (await refused(limit, queue)).free_at == taken.at + SECOND


async def test_keyed_buckets_are_independent(queue: Queue) -> None:
    limit = RateLimit("model", 1, timedelta(hours=1), key=lambda job: job.payload["m"])
    a = await limit.take(queue, key="small")
    assert a.wait == timedelta(0)
    assert (await refused(limit, queue, key="small")).free_at == a.at + timedelta(hours=1)
    assert (await limit.take(queue, key="large", max_wait=timedelta(0))).wait == \
        timedelta(0)
    await limit.backoff(queue, 60, key="large")
    assert (await refused(limit, queue, key="small")).free_at == a.at + timedelta(hours=1)
    states = {s.key: s for s in await rate_states(queue, "model")}
    assert sorted(states) == ["large", "small"]
    assert (states["small"].taken, states["large"].taken) == (1, 1)
    assert states["small"].refused == 2


async def test_bad_rate_limits_are_refused() -> None:
    for kwargs, message in [
        ({"limit": 0}, "limit must be an int >= 1"),
        ({"per": timedelta(0)}, "per must be positive"),
        ({"per": 60}, "per must be a datetime.timedelta"),
        ({"burst": 21}, "burst 21 must be at most limit 20"),
        ({"key": "owner"}, "key must be a function"),
        ({"max_wait": timedelta(seconds=-1)}, "max_wait must not be negative"),
    ]:
        args: dict[str, Any] = {"name": "x", "limit": 20, "per": SECOND, **kwargs}
        with pytest.raises(InvalidInput, match=message):
            RateLimit(**args)
    with pytest.raises(InvalidInput, match="more than one unit a microsecond"):
        RateLimit("x", 2_000_000, SECOND)


async def test_a_backoff_must_be_a_positive_duration(queue: Queue) -> None:
    limit = RateLimit("api", 10, SECOND)
    for bad in (0, -1, float("nan"), timedelta(0)):
        with pytest.raises(InvalidInput):
            await limit.backoff(queue, bad)
    # Past the 1000-year bound, in seconds as in a timedelta: one line, not the
    # OverflowError timedelta(seconds=1e15) raises.
    for huge, shown in ((1e15, "1000000000000000.0 seconds"), (1e12, "1000000000000.0 seconds"),
                        (timedelta(days=365_251), "31557686400 seconds")):
        with pytest.raises(InvalidInput, match=re.escape(
                f"backoff must be at most 31557600000 seconds (1000 years) either way, got "
                f"{shown}")):
            await limit.backoff(queue, huge)
    assert await rate_states(queue) == []


async def test_a_take_refuses_a_negative_max_wait_as_the_limit_does(queue: Queue) -> None:
    limit = RateLimit("api", 10, SECOND)
    with pytest.raises(InvalidInput, match=re.escape(
            "rate limit 'api': max_wait must not be negative, got -1 second")):
        await limit.take(queue, max_wait=timedelta(seconds=-1))
    assert await rate_states(queue) == []


LATEST_DUE = "9999-12-30T00:00:00+00:00"


async def test_a_debt_past_year_9999_saturates_and_the_bucket_stays_readable(
        queue: Queue, database_url: str) -> None:
    # One unit a year, 2**31 - 1 spent after the fact: units * emission overflowed
    # PostgreSQL's interval ("interval out of range"); 30,000 of them put the bucket's
    # full-again instant in year 32026, which no later take, peek or listing could load.
    yearly = RateLimit("yearly", 1, timedelta(days=365))
    for units in (30_000, 2**31 - 1, 2**31 - 1):
        spent = await yearly.take(queue, units, after=True)
        assert spent.wait == timedelta(0)
    no = await refused(yearly, queue)
    assert no.free_at.isoformat() == LATEST_DUE
    assert (await yearly.peek(queue)).free_at.isoformat() == LATEST_DUE
    [state] = await rate_states(queue)
    assert (state.name, state.taken, state.next_free.isoformat()) == (
        "yearly", 30_000 + 2 * (2**31 - 1), LATEST_DUE)
    result = await asyncio.to_thread(  # the command runs its own event loop
        CliRunner().invoke, cli, ["limits", "--schema", queue.schema, "--json"],
        env={"DATABASE_URL": database_url})
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)
    assert (row["name"], row["next_free"]) == ("yearly", LATEST_DUE)
    # A debt that fits is exact, to the microsecond: 3 units of 1/7 s (142,858 µs).
    sevenths = RateLimit("sevenths", 7, SECOND)
    spent = await sevenths.take(queue, 3, after=True)
    assert (await refused(sevenths, queue)).free_at == spent.at + 3 * timedelta(
        microseconds=142_858)


async def test_the_upgrade_brings_a_bucket_left_past_year_9999_back(
        database_url: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A schema made before migration 012, whose old rate_take left a bucket in year
    # 32026: the upgrade saturates it, and the bucket is readable again.
    shipped = db.migrations()
    before = tuple(m for m in shipped if m.version < 12)
    monkeypatch.setattr(db, "migrations", lambda: before)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        await db.migrate(c, schema)
        await c.execute(f"INSERT INTO {schema}.rate_buckets (name, tat, limit_units, per, "
                        "burst, emission, window_start, updated_at) VALUES ('yearly', "
                        "'32026-01-01 00:00:00+00', 1, '365 days', 1, '365 days', "
                        "'-infinity', now())")
        # The upgrade as 012 shipped: a later migration may assume a schema its
        # predecessors made, which the fresh install above is not exactly.
        upto_12 = tuple(m for m in shipped if m.version <= 12)
        monkeypatch.setattr(db, "migrations", lambda: upto_12)
        assert await db.migrate(c, schema) == [12]
        monkeypatch.undo()
    async with Queue(database_url, schema=schema) as queue:
        [state] = await rate_states(queue)
        assert state.next_free.isoformat() == LATEST_DUE


# -- the runner ------------------------------------------------------------------------


async def job_rows(aconn: psycopg.AsyncConnection[Any], queue: Queue) -> list[Any]:
    cur = await aconn.execute(
        f"SELECT id, status, attempts, deferrals, run_after FROM {queue.schema}.jobs "
        f"ORDER BY id")
    return await cur.fetchall()


async def test_a_stage_waits_for_its_units_without_burning_attempts(
        make_queue: Any, aconn: psycopg.AsyncConnection[Any]) -> None:
    queue = await make_queue(types=["call"])
    limit = RateLimit("api", 1, timedelta(hours=1))
    ran: list[int] = []

    async def call(ctx: JobContext) -> None:
        ran.append(ctx.job.id)

    pipeline = Pipeline(queue, [Stage("call", 5, 5, call, rate_limits=limit)])
    ids = await enqueue_jobs(queue, "call", 3)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.stop_reason, result.jobs_done, result.jobs_deferred) == ("no_work", 1, 0)
    assert ran == ids[:1]
    # The claim took only what the bucket could start; the rest wait, pending, for the
    # next unit, never claimed (attempts and deferrals untouched).
    [state] = await rate_states(queue)
    rows = await job_rows(aconn, queue)
    assert [r[1:4] for r in rows] == [("done", 1, 0), ("pending", 0, 0), ("pending", 0, 0)]
    assert rows[1][4] == rows[2][4] == state.next_free
    assert result.summary["rate_postponed"] == 2
    queue.clock_offset = timedelta(hours=1)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.jobs_done, ran) == (1, ids[:2])


async def test_a_run_sleeps_until_its_stage_can_go_on(make_queue: Any) -> None:
    queue = await make_queue(types=["call"])
    # Never wait in a slot: each unit further away makes the stage wait, and the run
    # (with nothing else to do) sleeps until then instead of ending.
    limit = RateLimit("api", 4, SECOND, max_wait=timedelta(0))
    granted: list[Any] = []

    async def call(ctx: JobContext) -> None:
        granted.append(ctx.rate_grants["api"].at)

    pipeline = Pipeline(queue, [Stage("call", 10, 10, call, rate_limits=limit)])
    await enqueue_jobs(queue, "call", 3)
    result = await pipeline.run("manual", timedelta(seconds=20))
    assert (result.stop_reason, result.jobs_done, result.jobs_deferred) == ("no_work", 3, 0)
    assert result.summary["rate_waited_s"] > 0
    assert len(granted) == 3
    assert all(b - a >= timedelta(milliseconds=250) for a, b in itertools.pairwise(granted))


async def test_a_job_whose_units_are_not_there_is_deferred_to_the_moment_they_are(
        make_queue: Any, aconn: psycopg.AsyncConnection[Any]) -> None:
    queue = await make_queue(types=["call"])
    # Keyed: the claim cannot know each job's bucket, so the take refuses and defers.
    limit = RateLimit("model", 1, timedelta(hours=1), key=lambda job: job.payload["m"])

    async def call(ctx: JobContext) -> None:
        pass

    pipeline = Pipeline(queue, [Stage("call", 10, 1, call, rate_limits=limit)])
    for m in ["a", "a", "b", "a", "b"]:
        await queue.enqueue("call", {"m": m})
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.stop_reason, result.jobs_done, result.jobs_deferred) == ("no_work", 2, 3)
    assert result.summary["rate_deferred"] == result.summary["rate.model.deferred"] == 3
    states = {s.key: s for s in await rate_states(queue)}
    rows = await job_rows(aconn, queue)
    assert [r[1:4] for r in rows] == [
        ("done", 1, 0), ("pending", 0, 1), ("done", 1, 0), ("pending", 0, 1),
        ("pending", 0, 1)]
    assert rows[1][4] == rows[3][4] == states["a"].next_free
    assert rows[4][4] == states["b"].next_free
    assert (states["a"].waiting, states["b"].waiting) == (2, 1)
    assert states["a"].next_wake == states["a"].next_free
    queue.clock_offset = timedelta(hours=1)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.jobs_done, result.jobs_deferred) == (2, 1)
    rows = await job_rows(aconn, queue)
    assert [r[1:4] for r in rows] == [
        ("done", 1, 0), ("done", 1, 1), ("done", 1, 0), ("pending", 0, 2),
        ("done", 1, 1)]


async def test_a_key_function_that_raises_fails_its_job_not_the_run(
        make_queue: Any, aconn: psycopg.AsyncConnection[Any]) -> None:
    queue = await make_queue(types=["call"])
    limit = RateLimit("model", 100, SECOND, key=lambda job: job.payload["m"])

    async def call(ctx: JobContext) -> None:
        pass

    pipeline = Pipeline(queue, [Stage("call", 10, 1, call, rate_limits=limit)])
    await queue.enqueue("call", {"m": "a"})
    await queue.enqueue("call", {"no model": True})
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.stop_reason, result.jobs_done, result.summary["retries"]) == (
        "no_work", 1, 1)
    cur = await aconn.execute(f"SELECT status, attempts, last_error FROM {queue.schema}.jobs"
                              f" ORDER BY id")
    assert await cur.fetchall() == [("done", 1, None), ("pending", 1, "KeyError: 'm'")]


async def test_tokens_spent_after_the_fact_make_later_jobs_wait(
        make_queue: Any, aconn: psycopg.AsyncConnection[Any]) -> None:
    queue = await make_queue(types=["ask"])
    tokens = RateLimit("tokens", 100, timedelta(minutes=1))  # a token every 0.6 s

    async def ask(ctx: JobContext) -> None:
        await ctx.take("tokens", 299, after=True)  # the model's answer cost 299 tokens

    pipeline = Pipeline(queue, [Stage("ask", 1, 1, ask, rate_limits=tokens)])
    await enqueue_jobs(queue, "ask", 2)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.jobs_done, result.summary["rate.tokens"]) == (1, 299)
    [state] = await rate_states(queue)
    assert state.taken == 300
    # A full bucket holds 1 token; 300 were taken, so it owes 299, less what refilled.
    refilled = (state.now - (state.next_free - timedelta(seconds=180))) / timedelta(
        seconds=0.6)
    assert state.available == pytest.approx(1 - 300 + refilled, abs=1e-6)
    rows = await job_rows(aconn, queue)
    # 300 tokens are paid back 180 s after the first take: the second job waits that long.
    assert [r[1:4] for r in rows] == [("done", 1, 0), ("pending", 0, 0)]
    assert rows[1][4] == state.next_free


async def test_a_429_backoff_defers_the_job_and_holds_every_worker_off(
        make_queue: Any, aconn: psycopg.AsyncConnection[Any]) -> None:
    queue = await make_queue(types=["call"])
    limit = RateLimit("api", 100, SECOND)
    answered: list[int] = []

    async def call(ctx: JobContext) -> None:
        if not answered:
            answered.append(ctx.job.id)
            await ctx.backoff(limit, 30)  # HTTP 429, Retry-After: 30
        answered.append(ctx.job.id)

    pipeline = Pipeline(queue, [Stage("call", 1, 1, call, rate_limits=limit)])
    ids = await enqueue_jobs(queue, "call", 2)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.stop_reason, result.jobs_done, result.jobs_deferred) == ("no_work", 0, 1)
    [state] = await rate_states(queue)
    rows = await job_rows(aconn, queue)
    assert [r[1:4] for r in rows] == [("pending", 0, 1), ("pending", 0, 0)]
    assert rows[0][4] == rows[1][4] == state.backoff_until == state.next_free
    assert answered == ids[:1]
    queue.clock_offset = timedelta(seconds=30)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert result.jobs_done == 2


async def test_a_handler_take_refused_defers_its_job(
        make_queue: Any, aconn: psycopg.AsyncConnection[Any]) -> None:
    queue = await make_queue(types=["call"])
    limit = RateLimit("api", 1, timedelta(hours=1), max_wait=timedelta(0))

    async def call(ctx: JobContext) -> None:
        await ctx.take(limit)

    pipeline = Pipeline(queue, [Stage("call", 2, 1, call)], rate_limits=[limit])
    await enqueue_jobs(queue, "call", 2)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.jobs_done, result.jobs_deferred) == (1, 1)
    [state] = await rate_states(queue)
    rows = await job_rows(aconn, queue)
    assert [r[1:4] for r in rows] == [("done", 1, 0), ("pending", 0, 1)]
    assert rows[1][4] == state.next_free


async def test_a_take_the_jobs_own_units_keep_out_of_reach_fails_instead_of_deferring(
        make_queue: Any, aconn: psycopg.AsyncConnection[Any],
        caplog: pytest.LogCaptureFixture) -> None:
    """A stage declares api (20 a minute, burst 1: a unit every 3 s, max_wait 1 s) and
    its handler takes api again: the second unit is 3 s after the stage's, past
    max_wait, for every attempt. Deferring would spend the stage's unit each time and
    never start the work; the take fails the attempt with the reason instead (retried
    with backoff, then failed), warns naming the limit and the stage, and counts."""
    queue = await make_queue(types=["search"], max_attempts=2)
    api = RateLimit("api", 20, timedelta(minutes=1))

    async def search(ctx: JobContext) -> None:
        await ctx.take(api)

    pipeline = Pipeline(queue, [Stage("search", 1, 1, search, rate_limits=[api])])
    await enqueue_jobs(queue, "search", 1)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.jobs_done, result.jobs_deferred, result.summary["retries"]) == (0, 0, 1)
    assert result.summary["rate.api.unreachable"] == 1
    assert "rate_deferred" not in result.summary
    message = ("rate limit 'api' in stage 'search': this job already holds 1 unit(s) of "
               "it from this attempt and asks 1 more; with burst 1 they come ")
    [warning] = [r.getMessage() for r in caplog.records if "can never be granted" in
                 r.getMessage()]
    assert message in warning
    [row] = await job_rows(aconn, queue)
    assert row[1:4] == ("pending", 1, 0)  # an attempt spent, no deferral
    cur = await aconn.execute(f"SELECT last_error FROM {queue.schema}.jobs")
    [(error,)] = await cur.fetchall()
    assert error.startswith("RateLimitUnreachable: " + message)
    assert "past max_wait 1 s, so this take can never be granted" in error
    # The second attempt (after its backoff and the bucket's 3 s) ends the job failed.
    queue.clock_offset = timedelta(minutes=10)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.jobs_done, result.jobs_failed) == (0, 1)
    [row] = await job_rows(aconn, queue)
    assert row[1:4] == ("failed", 2, 0)


async def test_two_units_a_job_with_a_burst_of_two_are_granted(make_queue: Any) -> None:
    """The documented way to spend two units a job: a burst of 2, so the stage's unit
    and the handler's come together (docs/design.md, "Rates")."""
    queue = await make_queue(types=["search"])
    api = RateLimit("api", 20, timedelta(minutes=1), burst=2)

    async def search(ctx: JobContext) -> None:
        await ctx.take(api)

    pipeline = Pipeline(queue, [Stage("search", 1, 1, search, rate_limits=[api])])
    await enqueue_jobs(queue, "search", 1)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.jobs_done, result.summary["rate.api"]) == (1, 1)
    assert "rate.api.unreachable" not in result.summary


async def test_a_take_refused_by_other_takers_still_defers(
        make_queue: Any, aconn: psycopg.AsyncConnection[Any]) -> None:
    """Refused because another taker holds the units (not the job's own): deferred as
    before, no failure."""
    queue = await make_queue(types=["search"])
    api = RateLimit("api", 1, timedelta(hours=1), burst=1)
    other = RateLimit("other", 1, timedelta(hours=1))
    await other.take(queue, 1)  # someone else spent the only unit of "other"

    async def search(ctx: JobContext) -> None:
        await ctx.take(other)

    pipeline = Pipeline(queue, [Stage("search", 1, 1, search, rate_limits=[api])])
    await enqueue_jobs(queue, "search", 1)
    result = await pipeline.run("manual", timedelta(seconds=10))
    assert (result.jobs_done, result.jobs_deferred) == (0, 1)
    assert result.summary["rate.other.deferred"] == 1


async def test_a_job_deferred_for_a_rate_again_and_again_is_reported(
        make_queue: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Another taker gets the unit first, run after run: from the 10th deferral on the
    run warns naming the limit and the stage, and counts rate.NAME.repeated."""
    queue = await make_queue(types=["call"])
    shared = RateLimit("shared", 1, timedelta(hours=1), max_wait=timedelta(0))

    async def call(ctx: JobContext) -> None:
        await ctx.take(shared)

    pipeline = Pipeline(queue, [Stage("call", 1, 1, call)], rate_limits=[shared])
    await enqueue_jobs(queue, "call", 1)
    repeated = []
    for hour in range(11):
        queue.clock_offset = timedelta(hours=hour)
        await shared.take(queue, 1)  # the other taker, first every time
        result = await pipeline.run("manual", timedelta(seconds=10))
        assert result.jobs_deferred == 1
        repeated.append(result.summary.get("rate.shared.repeated", 0))
    assert repeated == [0] * 9 + [1, 1]  # deferrals 10 and 11
    warnings = [r.getMessage() for r in caplog.records
                if "deferred for rate limit 'shared' again" in r.getMessage()]
    assert len(warnings) == 2 and warnings[0].startswith("stage 'call': job(s) [")
    assert warnings[0].endswith("(deferrals: [10]); its units keep going elsewhere: check "
                                "the limit's size and who takes it (rota limits)")


async def test_limit_names_are_checked(make_queue: Any) -> None:
    queue = await make_queue(types=["a", "b"])

    async def h(ctx: JobContext) -> None:
        pass

    one, other = RateLimit("api", 1, SECOND), RateLimit("api", 2, SECOND)
    with pytest.raises(ConfigError, match="two different rate limits are named 'api'"):
        Pipeline(queue, [Stage("a", 1, 1, h, rate_limits=one),
                         Stage("b", 1, 1, h, rate_limits=[other])])
    with pytest.raises(InvalidInput, match="rate_limits must be"):
        Stage("a", 1, 1, h, rate_limits="api")  # type: ignore[arg-type]
    pipeline = Pipeline(queue, [Stage("a", 1, 1, h, rate_limits=one)])
    assert pipeline.rate_limit("api") is one
    with pytest.raises(ConfigError, match="unknown rate limit 'nope'; known: api"):
        pipeline.rate_limit("nope")


# -- a fleet of real worker processes --------------------------------------------------


def busiest(instants: list[float]) -> int:
    """The most of the sorted ``instants`` in any half-open window of 1 s."""
    return max(bisect.bisect_left(instants, t + 1.0) - i for i, t in enumerate(instants))


def test_four_workers_share_one_limit_of_20_a_second(database_url: str,
                                                    migrated: str) -> None:
    """4 processes x concurrency 8 against 20 a second. The limiter's guarantee is exact:
    the instants the units were the jobs' (PostgreSQL's clock) are never more than 20 in
    any 1-second window. Each handler starts at or after its instant, late by the take's
    reply and an event-loop turn (this host's clock is the database's: one machine), so
    a window of starts can only hold more than 20 when a start is later than the one 20
    after it by over an emission interval (50 ms): at most 21 while the lateness varies
    by less than 50 ms (an idle machine), 20 + ceil(spread / 50 ms) in general. Every job
    ends done with attempts 1, and the fleet reaches >= 90 % of the limit."""
    jobs = 140
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"SELECT {migrated}.enqueue_many(%s::jsonb)",
                     [json.dumps([{"type": "call", "payload": {"i": i}}
                                  for i in range(jobs)])])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tests.rate_fleet", database_url, migrated, "20", "8",
         "0.05"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for _ in range(4)]
    starts: list[float] = []
    grants: list[float] = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            seen = json.loads(out.strip().splitlines()[-1])
            starts += seen["starts"]
            grants += seen["grants"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(f"SELECT status, attempts, count(*) FROM {migrated}.jobs "
                            f"GROUP BY 1, 2").fetchall()
    assert rows == [("done", 1, jobs)]
    assert len(starts) == jobs
    # On PostgreSQL's clock, the instants the units were the jobs': never more than 20.
    assert busiest(sorted(grants)) == 20
    # No handler starts before its units are its own.
    late = [start - grant for start, grant in zip(starts, grants, strict=True)]
    assert min(late) >= 0, min(late)
    spread = max(late) - min(late)
    assert busiest(sorted(starts)) <= 20 + max(1, math.ceil(spread / 0.05)), spread
    rate = (jobs - 1) / (max(starts) - min(starts))
    assert rate >= 18.0, rate


# -- seen from outside -----------------------------------------------------------------


def test_rota_limits_is_readable_at_80_columns(database_url: str, migrated: str) -> None:
    """Eleven columns wrapped into 1-5-character ones at 80 columns: the table keeps
    what a reader needs there (the rate as 500/1m, the next free unit as a wait), and
    the key column only when a limit is keyed; --json has the rest."""
    limit = RateLimit("openai", 10, timedelta(hours=1), burst=5)  # a unit in 6 minutes
    keyed = RateLimit("model-tokens", 200_000, timedelta(minutes=1),
                      key=lambda job: job.payload["m"])

    async def spend(*limits: tuple[RateLimit, int, str | None]) -> None:
        async with Queue(database_url, schema=migrated) as queue:
            for lim, units, key in limits:
                if key is None:
                    await lim.take(queue, units, after=True)
                else:
                    await lim.take(queue, units, key=key, after=True)

    asyncio.run(spend((limit, 3, None)))
    env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": migrated, "COLUMNS": "80"}
    out = CliRunner().invoke(cli, ["limits"], env=env).stdout
    assert out == (
        "                rate limits (1 bucket)                \n"
        "limit  rate  burst used before avail next free waiting\n"
        "──────────────────────────────────────────────────────\n"
        "openai 10/1h     5    3      0   2.0 now             0\n"
        "used, before: units taken in this window of the period and the one before. \n"
        "avail: units a take could have now (below 0: owed). --json: every bucket's \n"
        "totals and instants.\n")
    asyncio.run(spend((keyed, 9_000, "gpt-4o-mini"), (keyed, 1, "small")))
    out = CliRunner().invoke(cli, ["limits"], env=env).stdout
    lines = out.splitlines()
    assert lines[1].split() == ["limit", "key", "rate", "burst", "used", "before", "avail",
                                "next", "free", "waiting"]
    assert re.fullmatch(r"model-tokens gpt-4o-mini 200000/1m +1 9000 +0 +-8\d{3} in "
                        r"2\.\ds +0", lines[3]), lines[3]
    assert max(len(line) for line in lines) <= 80 and len(lines) == 9


def test_rota_limits_lists_each_bucket(database_url: str, migrated: str) -> None:
    limit = RateLimit("model", 500, timedelta(minutes=1), key=lambda job: job.payload["m"])

    async def spend() -> tuple[Any, Any]:
        async with Queue(database_url, schema=migrated) as queue:
            taken = await limit.take(queue, 1, key="small")
            await limit.take(queue, 9, key="small", after=True)
            return taken, await limit.backoff(queue, 30, key="large")

    taken, until = asyncio.run(spend())
    env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": migrated, "COLUMNS": "200"}
    result = CliRunner().invoke(cli, ["limits", "--json"], env=env)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["name"], r["key"], r["limit"], r["per_seconds"], r["burst"], r["taken"],
             r["waiting"]) for r in rows] == [
        ("model", "large", 500, 60.0, 1, 0, 0), ("model", "small", 500, 60.0, 1, 10, 0)]
    large, small = rows
    assert large["next_free"] == large["backoff_until"] == until.isoformat()
    # Ten units taken from a full bucket of one: the next is there 10 x 120 ms after.
    assert small["next_free"] == (taken.at + timedelta(seconds=1.2)).isoformat()
    assert small["window_units"] + small["prev_units"] == 10
    table = CliRunner().invoke(cli, ["limits", "--name", "model"], env=env)
    assert table.exit_code == 0, table.output
    assert "rate limits (2 buckets)" in table.stdout and "500/1m" in table.stdout
    empty = CliRunner().invoke(cli, ["limits", "--name", "nope", "--json"], env=env)
    assert json.loads(empty.stdout) == []
    # Not an empty table: a line that says why there is nothing.
    none = CliRunner().invoke(cli, ["limits", "--name", "nope"], env=env)
    assert (none.exit_code, none.stdout) == (
        0, "no bucket of rate limit 'nope' yet: a limit has one once a unit of it is "
           "taken\n")
    one = CliRunner().invoke(cli, ["limits", "--name", "model", "-n", "1"], env=env)
    assert "rate limits (1 bucket)" in one.stdout


async def test_the_quotas_page_and_metrics_show_the_rate_limits(
        make_queue: Any) -> None:
    from rota import dashboard_app

    from .test_dashboard import SECRET, basic, client
    from .test_metrics import only, samples

    queue = await make_queue(types=["call"])
    keyed = RateLimit("model", 500, timedelta(minutes=1), key=lambda job: job.payload["m"])
    api = RateLimit("api", 1200, timedelta(minutes=1))
    # Units count in fixed windows of `per` aligned to the epoch: put the queue's clock
    # 5 s into a minute, so this test's takes and its scrape share one window.
    now = await queue.now()
    queue.clock_offset = timedelta(seconds=65 - now.second - now.microsecond / 1e6)

    async def call(ctx: JobContext) -> None:
        pass

    pipeline = Pipeline(queue, [Stage("call", 10, 1, call, rate_limits=[keyed])])
    await keyed.take(queue, 3, key="small", after=True)
    await keyed.backoff(queue, 90, key="large")
    await api.take(queue)
    for m in ["large", "large", "small"]:
        await queue.enqueue("call", {"m": m})
    result = await pipeline.run("manual", timedelta(seconds=5))
    # "small" owes 3 units of a 120 ms bucket: its job waits 360 ms at most 1 s: it runs;
    # "large" backs off 90 s: its two jobs wait.
    assert (result.jobs_done, result.jobs_deferred) == (1, 2)
    app = dashboard_app(queue, secret=SECRET)
    async with client(app, headers=basic()) as c:
        page = (await c.get("/quotas")).text
        metrics = samples((await c.get("/metrics")).text)
    rows = re.findall(r"<tr><td>(\w+)</td><td>(?:<span[^>]*>)?([\w—]+)(?:</span>)?</td>"
                      r"\s*<td>([^<]+)</td>", page)
    assert rows == [("api", "—", "1,200 per 1 min"), ("model", "large", "500 per 1 min"),
                    ("model", "small", "500 per 1 min")]
    large = page[page.index("<td>large</td>"):]
    large = large[:large.index("</tr>")]
    assert "(backoff)" in large and re.search(r'<td class="num">2</td>\s*<td class="num">0'
                                              r'</td>', large)  # 2 waiting, 0 taken
    timed = {("rota_rate_units_available", (("limit", "api"),)),
             ("rota_rate_units_available", (("limit", "model"),)),
             ("rota_rate_next_free_seconds", (("limit", "model"),))}
    rated = only(metrics, "rota_rate_")
    assert timed <= set(rated)
    assert {k: v for k, v in rated.items() if k not in timed} == {
        ("rota_rate_units_window", (("limit", "api"),)): 1.0,
        ("rota_rate_units_window", (("limit", "model"),)): 4.0,
        ("rota_rate_units_limit", (("limit", "api"),)): 1200.0,
        ("rota_rate_units_limit", (("limit", "model"),)): 500.0,
        ("rota_rate_period_seconds", (("limit", "api"),)): 60.0,
        ("rota_rate_period_seconds", (("limit", "model"),)): 60.0,
        ("rota_rate_next_free_seconds", (("limit", "api"),)): 0.0,
        ("rota_rate_waiting_jobs", (("limit", "api"),)): 0.0,
        ("rota_rate_waiting_jobs", (("limit", "model"),)): 2.0,
        ("rota_rate_units_taken_total", (("limit", "api"),)): 1.0,
        ("rota_rate_units_taken_total", (("limit", "model"),)): 4.0,
        ("rota_rate_takes_refused_total", (("limit", "api"),)): 0.0,
        ("rota_rate_takes_refused_total", (("limit", "model"),)): 2.0,
    }
    # The emptiest bucket: "large", backing off 90 s (refilling from its end).
    next_free = metrics["rota_rate_next_free_seconds", (("limit", "model"),)]
    assert 85 < next_free <= 90
    assert metrics["rota_rate_units_available", (("limit", "model"),)] == pytest.approx(
        1 - next_free / 0.12, abs=0.5)
    # "api" gave its one unit at least a page load ago: refilling, not yet past full.
    assert 0 < metrics["rota_rate_units_available", (("limit", "api"),)] <= 1
