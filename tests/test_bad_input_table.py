"""The bad-input table, continued (tests/test_bad_input.py has the first rows): each row
is a clear error naming what was wrong, nothing written, and the worker keeps going.

Payloads: values JSON cannot hold or would silently change, sizes in UTF-8 bytes, and
what does round-trip exactly. Error texts a handler raises with NUL or lone surrogates.
Times: due times out of range, far in the past or future, a deferral until tomorrow
across both DST changes of the quota's zone, and the rule that every due time comes
from the database's clock, so an application clock that is off changes nothing.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import rota
from rota import (
    DeferJob,
    InvalidInput,
    Job,
    JobContext,
    PayloadError,
    Pipeline,
    Queue,
    Quota,
    Stage,
    SyncQueue,
)
from rota.checks import EARLIEST_DUE, LATEST_DUE
from rota.job import encode_payload

AConn = psycopg.AsyncConnection[Any]
LA = ZoneInfo("America/Los_Angeles")


async def count(aconn: AConn, queue: Queue) -> int:
    cur = await aconn.execute(sql.SQL("SELECT count(*) FROM {}").format(queue.table("jobs")))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def job_row(aconn: AConn, queue: Queue, job_id: int) -> dict[str, Any]:
    cur = aconn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {} WHERE id = %s").format(queue.table("jobs")),
                      [job_id])
    row = await cur.fetchone()
    assert row is not None
    return row


async def at(queue: Queue, instant: datetime) -> None:
    """Move the queue's clock so that its now() is (about) ``instant``."""
    queue.clock_offset = instant - (await queue.now() - queue.clock_offset)


@dataclass
class Point:
    x: int


# -- payloads -------------------------------------------------------------------------------


@pytest.mark.parametrize(("payload", "message"), [
    ({"raw": b"\x00\x01"}, "Object of type bytes is not JSON serializable"),
    ({"id": uuid.UUID(int=1)}, "Object of type UUID is not JSON serializable"),
    ({"day": date(2026, 1, 1)}, "Object of type date is not JSON serializable"),
    ({"at": datetime(2026, 1, 1, tzinfo=UTC)},
     "Object of type datetime is not JSON serializable"),
    ({"price": Decimal("Infinity")}, "payload\\['price'\\] is Decimal\\('Infinity'\\)"),
    ({"p": Point(1)}, "Object of type Point is not JSON serializable"),
    ({"gen": (i for i in range(3))}, "Object of type generator is not JSON serializable"),
    ({1: "one"}, "has the int key 1; JSON object keys are strings"),
    ({"nested": {None: 1}}, "payload\\['nested'\\] has the NoneType key None"),
    ({True: 1}, "has the bool key True"),
    ({"x": [(1, -math.inf)]}, "payload\\['x'\\]\\[0\\]\\[1\\] is -inf"),
    ({"x": float("nan")}, "is nan, which JSON cannot represent"),
    ({"\ud83d": 1}, "payload key contains a lone surrogate"),
    ({"deep": [[["a\x00"]]]}, "payload\\['deep'\\]\\[0\\]\\[0\\]\\[0\\] contains a NUL"),
    # UTF-8 bytes of the JSON text as PostgreSQL prints it: {"s": "éé…"}
    ({"s": "é" * 600_000}, "payload is 1200009 bytes, larger than the maximum 1048576"),
], ids=["bytes", "uuid", "date", "aware-datetime", "decimal-infinity", "dataclass", "generator",
        "int-key", "none-key", "bool-key", "-inf-in-tuple", "nan", "surrogate-key",
        "nested-nul", "oversize-in-utf8-bytes"])
async def test_payloads_refused_everywhere_with_nothing_written(
    queue: Queue, aconn: AConn, database_url: str, payload: Any, message: str
) -> None:
    with pytest.raises(PayloadError, match=message):
        await queue.enqueue("t", payload)
    with pytest.raises(PayloadError, match=f"item 1: .*{message}"):
        await queue.enqueue_many([{"type": "t", "payload": {}},
                                  {"type": "t", "payload": payload}])

    def sync() -> None:
        with psycopg.connect(database_url) as conn:
            with pytest.raises(PayloadError, match=message):
                SyncQueue(schema=queue.schema).enqueue(conn, "t", payload)

    if not isinstance(payload.get("gen"), type(i for i in ())):  # a generator is spent
        await asyncio.to_thread(sync)
    assert await count(aconn, queue) == 0


def test_datetimes_are_refused_and_decimals_stored_digit_for_digit_as_documented() -> None:
    """The rule is stated where it applies: encode_payload's docstring says how."""
    doc = encode_payload.__doc__ or ""
    assert "``when.isoformat()`` for an aware datetime" in doc
    assert "``Decimal`` values digit for digit" in doc
    exact = Decimal("0.1") + Decimal("0.2")
    assert encode_payload({"amount": exact}) == '{"amount":0.3}'
    assert encode_payload({"amount": str(exact)}) == '{"amount":"0.3"}'


async def test_what_is_accepted_round_trips_exactly(queue: Queue) -> None:
    deep: Any = "bottom"
    for _ in range(60):
        deep = {"d": [deep]}
    payload = {
        "big": 2**200, "neg": -(10**30), "tiny": 5e-324, "pi": 3.141592653589793,
        "text": "emoji 😀, RTL ‮override, line\u2028separator, tab\t", "": "empty key",
        "deep": deep, "pair": (1, 2),
    }
    job = await queue.enqueue("t", payload)
    assert job is not None
    assert job.payload == {**payload, "pair": [1, 2]}  # tuples are stored as lists
    [claimed] = await queue.claim("t", 1)
    assert claimed.payload == job.payload


async def test_a_float_written_with_an_exponent_comes_back_as_its_decimal(
    queue: Queue
) -> None:
    """jsonb keeps numbers as decimals: 1e20 is stored as 100000000000000000000 and
    read back as that int (equal in value); the docstring of encode_payload says so."""
    job = await queue.enqueue("t", {"f": 1e20, "g": 2.5e-7})
    assert job is not None
    assert job.payload == {"f": 10**20, "g": 2.5e-7}
    assert type(job.payload["f"]) is int
    assert "1e20" in (encode_payload.__doc__ or "")


async def test_integers_past_the_columns_are_refused_before_writing(
    queue: Queue, aconn: AConn, database_url: str
) -> None:
    too_big = 2**31
    with pytest.raises(InvalidInput, match="max_attempts must be at most 2147483647"):
        await queue.enqueue("t", {}, max_attempts=too_big)
    with pytest.raises(InvalidInput, match="item 0: max_attempts must be at most"):
        await queue.enqueue_many([{"type": "t", "payload": {}, "max_attempts": too_big}])
    with pytest.raises(InvalidInput, match="limit must be a positive int"):
        await queue.claim("t", too_big)
    with pytest.raises(InvalidInput, match="max_deferrals must be at most 2147483647"):
        Queue(database_url, max_deferrals=too_big)
    assert await count(aconn, queue) == 0
    job = await queue.enqueue("t", {}, max_attempts=too_big - 1)
    assert job is not None and job.max_attempts == too_big - 1


# -- error texts a handler raises ------------------------------------------------------------


async def test_handler_errors_with_nul_and_surrogates_still_fail_the_job(
    make_queue: Any, aconn: AConn
) -> None:
    """The error text is made storable (NUL as \\0, a lone surrogate as ?); the job
    retries, then fails, its give-up hook runs, and the run goes on to the next job."""
    queue: Queue = await make_queue()
    gave_up: list[int] = []

    async def boom(ctx: JobContext) -> None:
        if ctx.job.payload["bad"]:
            raise ValueError("quota\x00exceeded \udc80 for channel")

    async def hook(job: Job, conn: AConn) -> None:
        gave_up.append(job.id)

    pipeline = Pipeline(queue, [Stage("t", 1, 1, boom, max_attempts=2, on_give_up=hook)])
    bad = await pipeline.queue.enqueue("t", {"bad": True})  # the stage's max_attempts
    good = await pipeline.queue.enqueue("t", {"bad": False})
    assert bad is not None and good is not None
    first = await pipeline.run()
    assert (first.stop_reason, first.jobs_done, first.summary) == ("no_work", 1, {"retries": 1})
    row = await job_row(aconn, queue, bad.id)
    assert (row["status"], row["last_error"]) == (
        "pending", "ValueError: quota\\0exceeded ? for channel")
    queue.clock_offset = timedelta(minutes=3)  # past the 2-minute backoff
    second = await pipeline.run()
    assert (second.stop_reason, second.jobs_failed) == ("no_work", 1)
    row = await job_row(aconn, queue, bad.id)
    assert (row["status"], row["give_up_pending"]) == ("failed", False)
    assert row["last_error"] == "ValueError: quota\\0exceeded ? for channel"
    assert gave_up == [bad.id]


async def test_a_run_error_with_nul_and_surrogates_is_still_recorded(
    queue: Queue, aconn: AConn, caplog: pytest.LogCaptureFixture
) -> None:
    # The runner logs the error's traceback, surrogate and all; pytest-xdist could not
    # send that captured log to the controller (it must be UTF-8), so keep it out.
    caplog.set_level(logging.CRITICAL, logger="rota.runner")
    class Broken:
        async def run_once(self) -> dict[str, int]:
            raise RuntimeError("disk\x00full \ud800")

    async def handler(ctx: JobContext) -> None:
        pass

    result = await Pipeline(queue, [Stage("t", 1, 1, handler)]).run(maintenance=Broken())
    assert (result.stop_reason, result.error) == ("error", "RuntimeError: disk\\0full ?")
    cur = await aconn.execute(sql.SQL("SELECT stop_reason, error FROM {} WHERE id = %s")
                              .format(queue.table("runs")), [result.run_id])
    assert await cur.fetchone() == ("error", "RuntimeError: disk\\0full ?")


# -- times ------------------------------------------------------------------------------------


@pytest.mark.parametrize("when", [
    datetime(1, 1, 1, 12, tzinfo=UTC),
    datetime(9999, 12, 31, 23, tzinfo=UTC),
    EARLIEST_DUE - timedelta(microseconds=1),
    LATEST_DUE + timedelta(microseconds=1),
], ids=["year-1", "year-9999", "just-before-earliest", "just-after-latest"])
async def test_due_times_at_the_ends_of_the_calendar_are_refused(
    queue: Queue, aconn: AConn, when: datetime
) -> None:
    """PostgreSQL would store them, but a session in another time zone could not read
    them back (year 0 or 10000): the job would be written and the caller get an error."""
    message = "is out of range: due times must lie between 0001-01-02 and 9999-12-30"
    with pytest.raises(InvalidInput, match=message):
        await queue.enqueue("t", {}, run_after=when)
    with pytest.raises(InvalidInput, match=message):
        DeferJob(when)
    job = await queue.enqueue("t", {})
    assert job is not None
    [claimed] = await queue.claim("t", 1)
    with pytest.raises(InvalidInput, match=message):
        await queue.defer(claimed, when)
    assert (await job_row(aconn, queue, job.id))["status"] == "running"
    assert await count(aconn, queue) == 1


async def test_run_after_far_in_the_past_is_due_at_once_and_keeps_the_fair_order(
    database_url: str, schema: str, make_queue: Any
) -> None:
    """A due time in year 1 is simply due: it does not jump the queue (the order is by
    age), and it reads back in the farthest time zones."""
    await make_queue()
    queue = Queue(make_conninfo(database_url, options="-c timezone=America/Adak"),
                  schema=schema)
    async with queue:
        older = await queue.enqueue("t", {"n": 1})
        ancient = await queue.enqueue("t", {"n": 2}, run_after=EARLIEST_DUE)
        assert older is not None and ancient is not None
        assert ancient.run_after == EARLIEST_DUE
        assert [j.id for j in await queue.claim("t", 2)] == [older.id, ancient.id]


async def test_run_after_far_in_the_future_waits_and_reads_back_in_any_zone(
    database_url: str, schema: str, make_queue: Any
) -> None:
    await make_queue()
    queue = Queue(make_conninfo(database_url, options="-c timezone=Pacific/Kiritimati"),
                  schema=schema)
    async with queue:
        job = await queue.enqueue("t", {}, run_after=LATEST_DUE)
        assert job is not None and job.run_after == LATEST_DUE
        queue.clock_offset = timedelta(days=365 * 100)
        assert await queue.claim("t", 1) == []
        got = await queue.get_job(job.id)
        assert got is not None and got.run_after == LATEST_DUE


@pytest.mark.parametrize(("now", "reset", "hours"), [
    # The eve of spring-forward (2026-03-08): tomorrow starts at midnight PST.
    (datetime(2026, 3, 7, 18, 0, tzinfo=LA), datetime(2026, 3, 8, 8, 0, tzinfo=UTC), 24),
    # Spring-forward day: 23 hours long, tomorrow starts at midnight PDT.
    (datetime(2026, 3, 8, 10, 0, tzinfo=LA), datetime(2026, 3, 9, 7, 0, tzinfo=UTC), 23),
    # The eve of fall-back (2026-11-01): tomorrow starts at midnight PDT.
    (datetime(2026, 10, 31, 18, 0, tzinfo=LA), datetime(2026, 11, 1, 7, 0, tzinfo=UTC), 24),
    # Fall-back day, in the repeated hour: 25 hours long, tomorrow at midnight PST.
    (datetime(2026, 11, 1, 1, 30, fold=1, tzinfo=LA),
     datetime(2026, 11, 2, 8, 0, tzinfo=UTC), 25),
], ids=["spring-eve", "spring-day", "fall-eve", "fall-day"])
async def test_deferral_until_tomorrow_across_dst(
    queue: Queue, now: datetime, reset: datetime, hours: int
) -> None:
    """A handler whose daily quota is spent is deferred until tomorrow: local midnight
    in the quota's zone, on the queue's (database) clock. The job is not due a second
    before it, is due at it, and has its attempt back."""
    quota = Quota("api", 10, reset_tz="America/Los_Angeles")

    async def search(ctx: JobContext) -> None:
        await ctx.spend(quota, 10)

    pipeline = Pipeline(queue, [Stage("search", 2, 1, search)])
    await at(queue, now)
    first = await queue.enqueue("search", {"n": 1})
    second = await queue.enqueue("search", {"n": 2})
    assert first is not None and second is not None
    result = await pipeline.run()
    assert (result.jobs_done, result.jobs_deferred) == (1, 1)
    waiting = await queue.get_job(second.id)
    assert waiting is not None
    assert (waiting.status, waiting.attempts, waiting.deferrals) == ("pending", 0, 1)
    assert waiting.run_after == reset
    assert reset - quota.period_start(await queue.now()) == timedelta(hours=hours)
    queue.clock_offset += reset - await queue.now() - timedelta(seconds=1)
    assert await queue.claim("search", 1) == []
    queue.clock_offset += timedelta(seconds=1, milliseconds=100)
    assert (await pipeline.run()).jobs_done == 1


# -- the database clock is the only clock ------------------------------------------------------

CLOCK_LOG = """
CREATE TABLE {schema}.clock_log (
    job_id bigint, status text, run_after timestamptz, locked_at timestamptz,
    finished_at timestamptz, created_at timestamptz, tx_now timestamptz);
CREATE FUNCTION {schema}.clock_log() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.clock_log VALUES (NEW.id, NEW.status, NEW.run_after,
        NEW.locked_at, NEW.finished_at, NEW.created_at, now());
    RETURN NULL;
END $$;
CREATE TRIGGER clock_log AFTER INSERT OR UPDATE ON {schema}.jobs
    FOR EACH ROW EXECUTE FUNCTION {schema}.clock_log();
"""


async def test_every_due_time_the_queue_writes_is_the_database_clock(
    queue: Queue, aconn: AConn
) -> None:
    """Each timestamp is compared, exactly, with now() of the transaction that wrote it
    (logged by a trigger): had any come from the application's clock, it would differ
    (by an hour, for an application clock off by an hour). The queue clock's offset is
    added in the database too."""
    await aconn.execute(sql.SQL(CLOCK_LOG).format(schema=sql.Identifier(queue.schema)))
    queue.clock_offset = timedelta(hours=1)
    hour = timedelta(hours=1)
    job = await queue.enqueue("t", {})
    assert job is not None
    [c] = await queue.claim("t", 1)
    await queue.fail(c, "x")  # backoff: 2 minutes
    queue.clock_offset += timedelta(minutes=3)
    [c] = await queue.claim("t", 1)
    await queue.defer(c)  # due now
    [c] = await queue.claim("t", 1)
    await queue.complete(c)
    cur = aconn.cursor(row_factory=psycopg.rows.dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {} ORDER BY tx_now")
                      .format(queue.table("clock_log")))
    enq, claim1, failed, claim2, deferred, claim3, done = await cur.fetchall()
    assert enq["run_after"] == enq["created_at"] == enq["tx_now"] + hour
    assert claim1["locked_at"] == claim1["tx_now"] + hour
    assert failed["run_after"] == failed["tx_now"] + hour + timedelta(minutes=2)
    later = hour + timedelta(minutes=3)
    assert claim2["locked_at"] == claim2["tx_now"] + later
    assert deferred["run_after"] == deferred["tx_now"] + later
    assert claim3["locked_at"] == claim3["tx_now"] + later
    assert done["finished_at"] == done["tx_now"] + later


# Modules that compute or compare due times; none may read the application's wall clock
# (time.monotonic, a stopwatch for budgets, is fine: it is not a time of day).
CLOCK_FREE = ["job.py", "checks.py", "settings.py", "store.py", "queue.py",
              "runner/stage.py", "runner/context.py", "runner/completer.py",
              "runner/pipeline.py", "quota.py", "maintenance.py", "sync.py", "plans.py",
              "db.py", "schedule.py"]
WALL_CLOCK = {("datetime", "now"), ("datetime", "utcnow"), ("datetime", "today"),
              ("date", "today"), ("time", "time"), ("time", "time_ns"),
              ("time", "localtime"), ("time", "gmtime")}


@pytest.mark.parametrize("module", CLOCK_FREE)
def test_no_module_that_schedules_reads_the_application_clock(module: str) -> None:
    path = Path(rota.__file__).parent / module
    calls = [
        f"{node.func.value.id}.{node.func.attr} (line {node.lineno})"
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and (node.func.value.id, node.func.attr) in WALL_CLOCK
    ]
    assert calls == []
