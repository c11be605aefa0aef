"""Computed times saturate (docs/design.md, "Fail and backoff" and "Time"): the backoff
stops doubling at ``max_backoff`` (default 1 hour), no computed time leaves the range a
reader can load, and durations and the clock offset are bounded to 1000 years."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql
from psycopg.rows import dict_row

from rota import InvalidInput, Queue
from rota.checks import LATEST_DUE
from rota.cli import cli
from rota.settings import DEFAULT_MAX_BACKOFF
from tests.test_bad_input_table import CLOCK_LOG

AConn = psycopg.AsyncConnection[Any]


async def fail_log(aconn: AConn, queue: Queue) -> dict[str, Any]:
    """The last logged write of the job whose status became pending after a fail."""
    cur = aconn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {} ORDER BY tx_now DESC LIMIT 1")
                      .format(queue.table("clock_log")))
    row = await cur.fetchone()
    assert row is not None
    return row


async def test_31_reclaims_then_a_fail_is_retried_within_the_hour_not_in_year_10193(
    make_queue: Any, aconn: AConn, database_url: str
) -> None:
    """The issue's job: Queue(max_attempts=50), 31 reclaims after crashes, then one
    fail. Its run_after was year 10193 (1 minute * 2**32), which get_job, `rota jobs`
    and the claim could not read. Now it is the fail's now plus max_backoff, exactly."""
    queue: Queue = await make_queue(max_attempts=50)
    assert queue.max_backoff == DEFAULT_MAX_BACKOFF == timedelta(hours=1)
    await aconn.execute(sql.SQL(CLOCK_LOG).format(schema=sql.Identifier(queue.schema)))
    job = await queue.enqueue("t", {})
    assert job
    claimed = None
    for _ in range(32):  # the first claim, then 31 reclaims of a lock gone stale
        [claimed] = await queue.claim("t", 1)
        queue.clock_offset += timedelta(minutes=16)
    assert claimed is not None and claimed.attempts == 32
    queue.clock_offset -= timedelta(minutes=16)  # still under the last claim's lock
    assert await queue.fail(claimed, "crashed again") == "retry"
    logged = await fail_log(aconn, queue)
    assert logged["status"] == "pending"
    assert logged["run_after"] == logged["tx_now"] + queue.clock_offset + timedelta(hours=1)
    read = await queue.get_job(job.id)  # was DataError
    assert read is not None and read.run_after == logged["run_after"]

    def listing() -> Any:
        return CliRunner().invoke(cli, ["jobs", "--json"], catch_exceptions=False, env={
            "DATABASE_URL": database_url, "ROTA_SCHEMA": queue.schema, "ROTA_APP": None})

    listed = await asyncio.to_thread(listing)  # exited 1 for the whole listing
    assert listed.exit_code == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)] == [job.id]
    queue.clock_offset += timedelta(hours=1, seconds=1)
    [again] = await queue.claim("t", 1)  # raised once the job was due
    assert (again.id, again.attempts) == (job.id, 33)


@pytest.mark.parametrize(("base", "ceiling", "attempts_before_fail", "expected"), [
    (timedelta(minutes=1), timedelta(hours=1), 1, timedelta(minutes=2)),
    (timedelta(minutes=1), timedelta(hours=1), 5, timedelta(minutes=32)),
    (timedelta(minutes=1), timedelta(hours=1), 6, timedelta(hours=1)),  # 64 min capped
    (timedelta(seconds=30), timedelta(minutes=5), 3, timedelta(minutes=4)),
    (timedelta(seconds=30), timedelta(minutes=5), 4, timedelta(minutes=5)),
    (timedelta(0), timedelta(hours=1), 9, timedelta(0)),
], ids=["2min", "32min", "capped-at-1h", "4min", "capped-at-5min", "no-backoff"])
async def test_backoff_doubles_up_to_its_ceiling(
    make_queue: Any, aconn: AConn, base: timedelta, ceiling: timedelta,
    attempts_before_fail: int, expected: timedelta
) -> None:
    queue: Queue = await make_queue(backoff_base=base, max_backoff=ceiling, max_attempts=20)
    await aconn.execute(sql.SQL(CLOCK_LOG).format(schema=sql.Identifier(queue.schema)))
    await queue.enqueue("t", {})
    claimed = None
    for _ in range(attempts_before_fail):
        [claimed] = await queue.claim("t", 1)
        queue.clock_offset += timedelta(minutes=16)
    assert claimed is not None
    queue.clock_offset -= timedelta(minutes=16)
    assert await queue.fail(claimed, "x") == "retry"
    logged = await fail_log(aconn, queue)
    assert logged["run_after"] - logged["tx_now"] - queue.clock_offset == expected


async def test_no_computed_due_time_passes_the_latest_readable_one(queue: Queue) -> None:
    """The settings cannot reach it (durations are bounded to 1000 years), but the
    statement itself saturates: fail.sql given a backoff of 10,000 years stops the due
    time at LATEST_DUE, readable in every time zone, instead of writing year 12026."""
    await queue.enqueue("t", {})
    [claimed] = await queue.claim("t", 1)
    ten_thousand_years = timedelta(days=3_652_500)
    row = await queue.store.fetch_one("fail", {
        "id": claimed.id, "claim_token": claimed.claim_token, "offset": timedelta(0),
        "error": "x", "give_up": False, "backoff_base": ten_thousand_years,
        "max_backoff": ten_thousand_years, "latest_due": LATEST_DUE,
        "traceback": None, "error_type": None, "started_at": claimed.locked_at,
        "schema_name": queue.schema})
    assert row == ("pending",)
    job = await queue.get_job(claimed.id)
    assert job is not None and job.run_after == LATEST_DUE


@pytest.mark.parametrize(("settings", "message"), [
    ({"max_backoff": timedelta(seconds=30)},
     "max_backoff \\(30 seconds\\) must not be shorter than backoff_base \\(60 seconds\\)"),
    ({"max_backoff": timedelta(0)}, "max_backoff must be positive"),
    ({"backoff_base": timedelta(seconds=-1)},
     "backoff_base must not be negative, got -1 second$"),
    ({"stale_after": timedelta(days=400_000)},
     "stale_after must be at most 31557600000 seconds \\(1000 years\\) either way, got "
     "34560000000 seconds$"),
    ({"served_window": timedelta.max}, "served_window must be at most 31557600000 seconds"),
    ({"max_backoff": timedelta(days=365_251)}, "max_backoff must be at most 31557600000 seconds"),
], ids=["ceiling-below-base", "zero-ceiling", "negative-base", "huge-stale-window",
        "max-served-window", "huge-ceiling"])
def test_durations_that_would_leave_the_calendar_are_refused(
    database_url: str, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        Queue(database_url, **settings)


def test_the_clock_offset_is_bounded_too(database_url: str) -> None:
    queue = Queue(database_url)
    with pytest.raises(InvalidInput, match="clock_offset must be at most 31557600000 seconds"):
        queue.clock_offset = timedelta(days=-365_251)
    queue.clock_offset = timedelta(days=-365_250)
