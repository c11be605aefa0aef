"""Quotas: atomic spending, reserves, per-owner allowances and DST-correct resets."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from psycopg_pool import AsyncConnectionPool

from rota import (
    Allowance,
    ConfigError,
    InvalidInput,
    NaiveDatetimeError,
    Plan,
    Plans,
    Queue,
    Quota,
    QuotaExhausted,
)

LA = ZoneInfo("America/Los_Angeles")
YOUTUBE = Quota("youtube", 10_000, reserve=500, reset_tz="America/Los_Angeles")

PLANS = Plans([
    Plan("free", "Free", 0, {"searches_per_day": 2}),
    Plan("standard", "Standard", 1, {"searches_per_day": 5}),
    Plan("pro", "Pro", 2, {"searches_per_day": None}),
])
SEARCHES = Allowance("searches", "searches_per_day", reset_tz="America/Los_Angeles")


async def at(queue: Queue, instant: datetime) -> None:
    """Move the queue's clock so that its now() is (about) ``instant``."""
    real = await queue.now() - queue.clock_offset
    queue.clock_offset = instant - real


# -- reset times ------------------------------------------------------------------------


def test_reset_is_next_local_midnight_on_an_ordinary_day() -> None:
    now = datetime(2024, 6, 1, 15, 30, tzinfo=LA)
    assert YOUTUBE.period_start(now) == datetime(2024, 6, 1, 7, 0, tzinfo=UTC)
    assert YOUTUBE.next_reset(now) == datetime(2024, 6, 2, 7, 0, tzinfo=UTC)


def test_reset_across_spring_forward_is_23_hours_later() -> None:
    # 2024-03-10: clocks go from 02:00 PST to 03:00 PDT in Los Angeles.
    before = datetime(2024, 3, 9, 23, 59, tzinfo=LA)
    assert YOUTUBE.next_reset(before) == datetime(2024, 3, 10, 8, 0, tzinfo=UTC)  # PST
    during = datetime(2024, 3, 10, 1, 30, tzinfo=LA)
    start = YOUTUBE.period_start(during)
    reset = YOUTUBE.next_reset(during)
    assert start == datetime(2024, 3, 10, 8, 0, tzinfo=UTC)
    assert reset == datetime(2024, 3, 11, 7, 0, tzinfo=UTC)  # midnight PDT
    assert reset - start == timedelta(hours=23)
    assert reset.astimezone(LA).hour == 0


def test_reset_across_fall_back_is_25_hours_later() -> None:
    # 2024-11-03: clocks go from 02:00 PDT back to 01:00 PST; 01:30 happens twice.
    first = datetime(2024, 11, 3, 1, 30, fold=0, tzinfo=LA)
    second = datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=LA)
    for now in (first, second):
        assert YOUTUBE.period_start(now) == datetime(2024, 11, 3, 7, 0, tzinfo=UTC)  # PDT
        assert YOUTUBE.next_reset(now) == datetime(2024, 11, 4, 8, 0, tzinfo=UTC)  # PST
    assert (YOUTUBE.next_reset(first) - YOUTUBE.period_start(first)) == timedelta(hours=25)


def test_reset_is_exclusive_at_midnight() -> None:
    midnight = datetime(2024, 6, 2, 0, 0, tzinfo=LA)
    assert YOUTUBE.period_start(midnight) == midnight.astimezone(UTC)
    assert YOUTUBE.next_reset(midnight) == datetime(2024, 6, 3, 7, 0, tzinfo=UTC)


def test_naive_now_and_bad_settings_are_refused() -> None:
    with pytest.raises(NaiveDatetimeError):
        YOUTUBE.next_reset(datetime(2024, 6, 1, 12, 0))
    with pytest.raises(InvalidInput, match="unknown time zone"):
        Quota("q", 10, reset_tz="Mars/Olympus_Mons")
    with pytest.raises(InvalidInput, match="reserve"):
        Quota("q", 10, reserve=10)
    with pytest.raises(InvalidInput):
        Quota("q", 0)
    with pytest.raises(InvalidInput):
        Quota("", 10)


async def test_spending_resets_at_local_midnight_on_the_queue_clock(queue: Queue) -> None:
    quota = Quota("api", 100, reset_tz="America/Los_Angeles")
    # Spring-forward day, mid-morning: the period began at 08:00 UTC (midnight PST) and
    # ends at 07:00 UTC next day (midnight PDT).
    await at(queue, datetime(2024, 3, 10, 10, 0, tzinfo=LA))
    assert await quota.spend(queue, 100) == 0
    with pytest.raises(QuotaExhausted) as err:
        await quota.spend(queue, 1)
    assert err.value.resets_at == datetime(2024, 3, 11, 7, 0, tzinfo=UTC)
    assert err.value.reason == "exhausted" and err.value.remaining == 0
    usage = await quota.usage(queue)
    assert (usage.used, usage.remaining) == (100, 0)
    assert usage.period_start == datetime(2024, 3, 10, 8, 0, tzinfo=UTC)

    # 23:30 local: still the same period.
    await at(queue, datetime(2024, 3, 10, 23, 30, tzinfo=LA))
    with pytest.raises(QuotaExhausted):
        await quota.spend(queue, 1)
    # Just after midnight PDT: a fresh period.
    await at(queue, datetime(2024, 3, 11, 0, 1, tzinfo=LA))
    assert await quota.spend(queue, 1) == 99

    # Fall-back day: the 25-hour period.
    await at(queue, datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=LA))
    assert await quota.spend(queue, 100) == 0
    with pytest.raises(QuotaExhausted) as err:
        await quota.spend(queue, 1)
    assert err.value.resets_at == datetime(2024, 11, 4, 8, 0, tzinfo=UTC)


# -- atomic spending --------------------------------------------------------------------


async def test_concurrent_spenders_never_exceed_the_limit(database_url: str,
                                                          make_queue: Any) -> None:
    """40 spenders of 3 units on 20 real connections against a limit of 100: exactly
    33 succeed and exactly 99 units are recorded."""
    await make_queue()  # migrate the schema
    setup = await make_queue()
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, min_size=20, max_size=20, open=False, kwargs={"autocommit": True})
    await pool.open(wait=True)
    try:
        queue = Queue(pool, schema=setup.schema)
        quota = Quota("shared", 100)
        start = asyncio.Event()

        async def spender() -> bool:
            await start.wait()
            try:
                await quota.spend(queue, 3)
                return True
            except QuotaExhausted:
                return False

        tasks = [asyncio.create_task(spender()) for _ in range(40)]
        await asyncio.sleep(0.05)
        start.set()
        results = await asyncio.gather(*tasks)
        assert results.count(True) == 33
        assert results.count(False) == 7
        assert (await quota.usage(queue)).used == 99
    finally:
        await pool.close()


async def test_a_spend_larger_than_the_limit_never_records_anything(queue: Queue) -> None:
    quota = Quota("small", 10)
    with pytest.raises(QuotaExhausted):
        await quota.spend(queue, 11)
    assert (await quota.usage(queue)).used == 0
    with pytest.raises(InvalidInput):
        await quota.spend(queue, 0)


async def test_runs_do_not_spend_into_the_reserve(queue: Queue) -> None:
    quota = Quota("api", 100, reserve=30)
    assert await quota.spend(queue, 70) == 30
    with pytest.raises(QuotaExhausted) as err:
        await quota.spend(queue, 1)
    assert (err.value.reason, err.value.remaining) == ("reserve", 30)
    # Interactive work may use the reserve.
    assert await quota.spend(queue, 30, use_reserve=True) == 0
    assert quota.blocked(remaining=31, cost=1) is None
    assert quota.blocked(remaining=30, cost=1) == "reserve"
    assert quota.blocked(remaining=0, cost=1) == "exhausted"
    assert quota.blocked(remaining=50, cost=100) == "exhausted"


async def test_exhaust_records_the_provider_saying_so(queue: Queue) -> None:
    quota = Quota("api", 100)
    await quota.spend(queue, 10)
    exc = await quota.exhaust(queue)
    assert isinstance(exc, QuotaExhausted) and exc.reason == "exhausted"
    usage = await quota.usage(queue)
    assert (usage.used, usage.remaining) == (100, 0)


# -- per-owner allowances ---------------------------------------------------------------


async def test_allowance_limit_comes_from_the_owners_plan(make_queue: Any) -> None:
    queue: Queue = await make_queue(plans=PLANS)
    await queue.upsert_group("free-a", plan="free", owner_id="alice")
    await queue.upsert_group("free-b", plan="free", owner_id="alice")  # same owner
    await queue.upsert_group("std", plan="standard", owner_id="bob")
    await queue.upsert_group("pro", plan="pro", owner_id="carol")
    await queue.upsert_group("nobody", plan=None)

    assert await SEARCHES.spend(queue, "free-a") == 1
    assert await SEARCHES.spend(queue, "free-b") == 0  # the owner's allowance, not the group's
    with pytest.raises(QuotaExhausted) as err:
        await SEARCHES.spend(queue, "free-a")
    assert err.value.scope_key == "alice" and err.value.reason == "exhausted"

    for left in (4, 3, 2, 1, 0):
        assert await SEARCHES.spend(queue, "std") == left
    with pytest.raises(QuotaExhausted):
        await SEARCHES.spend(queue, "std")

    # Unlimited plan, no owner, no group: nothing applies, nothing recorded.
    for _ in range(10):
        assert await SEARCHES.spend(queue, "pro") is None
    assert await SEARCHES.spend(queue, "nobody") is None
    assert await SEARCHES.spend(queue, None) is None

    usage = await SEARCHES.usage(queue, "alice", "free")
    assert (usage.used, usage.limit, usage.remaining) == (2, 2, 0)

    # An upgrade takes effect at the next spend.
    await queue.upsert_group("free-a", plan="standard", owner_id="alice")
    assert await SEARCHES.spend(queue, "free-a") == 2


async def test_allowance_needs_the_limit_in_every_plan(queue: Queue) -> None:
    await queue.upsert_group("g", plan="free", owner_id="dave")
    with pytest.raises(ConfigError, match="searches_per_day"):
        await SEARCHES.spend(queue, "g")
