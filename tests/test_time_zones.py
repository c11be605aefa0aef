"""Durations are absolute, whatever the session's time zone (docs/design.md, "Time"):
every timedelta rota sends to PostgreSQL is an exact number of seconds, so the served
window, the stale window, the backoff, the clock offset and the retention mean the same
number of hours in a UTC session and in a Europe/Berlin one, on the days DST changes.
The clock is moved with clock_offset, never by sleeping."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from rota import ConfigError, PruneDoneJobs, Queue
from rota.store import configure_connection, configure_cursor
from tests.test_bad_input_table import CLOCK_LOG

AConn = psycopg.AsyncConnection[Any]
BERLIN = ZoneInfo("Europe/Berlin")



def next_dst_noons() -> dict[str, datetime]:
    """12:00 local on the next days Europe/Berlin changes clocks (the issue's 2025-10-26
    is one such day; the queue's clock only moves forward in tests, so the next ones
    stand for it): a calendar day before them is 23 hours (spring forward) and 25
    hours (fall back) ago. Given in UTC, so that arithmetic on them is absolute
    (Python adds to a Berlin datetime by the wall clock)."""
    found: dict[str, datetime] = {}
    day = datetime.now(UTC).date() + timedelta(days=2)
    while len(found) < 2:
        noon = datetime(day.year, day.month, day.day, 12, tzinfo=BERLIN)
        before = noon - timedelta(days=1)  # wall-clock arithmetic: noon the day before
        hours = (noon.astimezone(UTC) - before.astimezone(UTC)) / timedelta(hours=1)
        if hours != 24:
            found.setdefault(f"{'fall' if hours == 25 else 'spring'}-{day}",
                             noon.astimezone(UTC))
        day += timedelta(days=1)
    return found


DST_DAYS = next_dst_noons()
ZONES = ["UTC", "Europe/Berlin"]


@pytest.fixture(params=ZONES)
async def zoned(request: pytest.FixtureRequest, database_url: str, make_queue: Any,
                schema: str) -> AsyncIterator[Any]:
    """A factory of queues whose sessions run in the parametrized TimeZone."""
    await make_queue()  # migrates the schema
    made: list[Queue] = []

    async def make(**settings: Any) -> Queue:
        url = make_conninfo(database_url, options=f"-c timezone={request.param}")
        q = Queue(url, schema=schema, **settings)
        await q.open()
        async with q.connection() as c:
            cur = await c.execute("SHOW timezone")
            assert await cur.fetchone() == (request.param,)
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


async def at(queue: Queue, instant: datetime) -> None:
    """Move the queue's clock so that its now() is (about) ``instant``."""
    queue.clock_offset = instant - (await queue.now() - queue.clock_offset)


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("value", [
    timedelta(days=1), timedelta(days=400, seconds=3, microseconds=7), timedelta(hours=25),
    timedelta(days=-1, seconds=1), timedelta(microseconds=-1), timedelta(days=365_250),
], ids=["1-day", "400-days", "25-hours", "negative", "minus-1us", "1000-years"])
async def test_every_timedelta_is_sent_as_seconds_only(
    database_url: str, zone: str, value: timedelta
) -> None:
    url = make_conninfo(database_url, options=f"-c timezone={zone}")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for binary in (False, True):
            cur = conn.cursor(binary=binary)
            configure_cursor(cur)
            await cur.execute("SELECT extract(month FROM %(v)s::interval), "
                              "extract(day FROM %(v)s::interval), "
                              "extract(epoch FROM %(v)s::interval)::numeric, "
                              "%(v)s::interval", {"v": value})
            months, days, seconds, back = await cur.fetchone()  # type: ignore[misc]
            assert (months, days) == (0, 0)
            assert seconds == Decimal(value // timedelta(microseconds=1)) / 10**6
            assert back == value


@pytest.mark.parametrize("day", list(DST_DAYS))
async def test_the_served_window_of_a_day_is_24_hours(zoned: Any, day: str) -> None:
    """The issue's window: in a Berlin session on 2025-10-26, now() - interval '1 day'
    reached back 25 hours. A job of group A finished 24.5 hours ago is outside a 24-hour
    window, so A has served nothing and its older job goes first. (A 23-hour calendar
    day on 2025-03-30 would have left out one finished 23.5 hours ago.)"""
    queue: Queue = await zoned()
    noon = DST_DAYS[day]
    await queue.upsert_group("a", plan=None)
    await queue.upsert_group("b", plan=None)
    finish_ago = timedelta(hours=24.5) if day.startswith("fall") else timedelta(hours=23.5)
    await at(queue, noon - finish_ago - timedelta(minutes=1))
    served = await queue.enqueue("t", {}, group_id="a")
    assert served
    [c] = await queue.claim("t", 1)
    await at(queue, noon - finish_ago)
    assert await queue.complete(c)
    await at(queue, noon - timedelta(minutes=10))
    older = await queue.enqueue("t", {"who": "a"}, group_id="a")
    await at(queue, noon - timedelta(minutes=5))
    newer = await queue.enqueue("t", {"who": "b"}, group_id="b")
    assert older and newer
    await at(queue, noon)
    await queue.upkeep.run_once()  # the window's edge moved as a worker would move it
    [first] = await queue.claim("t", 1)
    expected = older.id if day.startswith("fall") else newer.id
    assert first.id == expected


@pytest.mark.parametrize("day", list(DST_DAYS))
async def test_a_one_day_stale_window_is_24_hours(zoned: Any, day: str) -> None:
    queue: Queue = await zoned(stale_after=timedelta(days=1))
    noon = DST_DAYS[day]
    await at(queue, noon - timedelta(hours=24, minutes=30))
    job = await queue.enqueue("t", {})
    assert job
    [held] = await queue.claim("t", 1)
    await at(queue, noon - timedelta(hours=23, minutes=30))
    assert await queue.claim("t", 1) == []  # 23 hours old: not stale
    await at(queue, noon)
    [reclaimed] = await queue.claim("t", 1)  # 24.5 hours old: stale, whatever the zone
    assert (reclaimed.id, reclaimed.attempts) == (held.id, 2)


@pytest.mark.parametrize("day", list(DST_DAYS))
async def test_the_clock_offset_and_the_backoff_are_exact(
    zoned: Any, aconn: AConn, day: str
) -> None:
    """Every timestamp the queue writes is the database's now() plus clock_offset to
    the microsecond (an offset of months across a DST change was an hour off in a
    Berlin session), and a one-day backoff is 24 hours."""
    queue: Queue = await zoned(backoff_base=timedelta(hours=12), max_backoff=timedelta(days=1))
    await aconn.execute(sql.SQL(CLOCK_LOG).format(schema=sql.Identifier(queue.schema)))
    await at(queue, DST_DAYS[day] - timedelta(hours=1))  # the offset spans the change
    offset = queue.clock_offset
    job = await queue.enqueue("t", {})
    assert job
    [c] = await queue.claim("t", 1)
    assert await queue.fail(c, "x") == "retry"
    cur = aconn.cursor(row_factory=dict_row)
    await cur.execute(sql.SQL("SELECT * FROM {} ORDER BY tx_now")
                      .format(queue.table("clock_log")))
    enq, claimed, failed = await cur.fetchall()
    assert enq["created_at"] == enq["tx_now"] + offset
    assert claimed["locked_at"] == claimed["tx_now"] + offset
    assert failed["run_after"] == failed["tx_now"] + offset + timedelta(hours=24)


@pytest.mark.parametrize("day", list(DST_DAYS))
async def test_retention_of_a_week_is_168_hours(zoned: Any, day: str) -> None:
    queue: Queue = await zoned()
    noon = DST_DAYS[day]
    # Fall back: 7 calendar days before noon are 169 hours; spring: 167.
    ago = timedelta(hours=168, minutes=30) if day.startswith("fall") \
        else timedelta(hours=167, minutes=30)
    await at(queue, noon - ago)
    old = await queue.enqueue("t", {})
    assert old
    [c] = await queue.claim("t", 1)
    await queue.complete(c)
    await at(queue, noon)
    counters = await PruneDoneJobs(queue, retention=timedelta(days=7)).run_once()
    expected = 1 if day.startswith("fall") else 0
    assert counters["jobs_deleted"] == expected
    assert (await queue.get_job(old.id) is None) == bool(expected)


def test_the_dst_days_are_what_the_tests_say() -> None:
    assert sorted(d.split("-")[0] for d in DST_DAYS) == ["fall", "spring"]
    for day, noon in DST_DAYS.items():
        local = noon.astimezone(BERLIN)
        assert local.hour == 12
        noon_before = local - timedelta(days=1)  # Python: wall-clock arithmetic
        hours = (noon - noon_before.astimezone(UTC)) / timedelta(hours=1)
        assert hours == (25 if day.startswith("fall") else 23)
    # The issue's day is one of them.
    issue_day = datetime(2025, 10, 26, 12, tzinfo=BERLIN)
    assert (issue_day - (issue_day - timedelta(days=1))).total_seconds() == 86400
    assert (issue_day.astimezone(UTC) - (issue_day - timedelta(days=1)).astimezone(UTC)
            ) == timedelta(hours=25)


async def test_an_enqueue_reads_utc_times_after_its_connection_changes_time_zone(
    migrated: str, database_url: str, aconn: AConn
) -> None:
    """The single enqueue keeps a cursor per pooled connection (Store.hot_cursor), set up
    for the session's TimeZone: after a ``SET TimeZone`` on that connection, the job's
    times come back as a new cursor reads them (``get_job``'s), in UTC (one connection
    in the pool: every statement takes the same one)."""
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url, open=False, min_size=1, max_size=1,
        kwargs={"autocommit": True}, configure=configure_connection)
    await pool.open(wait=True)
    queue = Queue(pool, schema=migrated)
    try:
        utc = await queue.enqueue("t", {})
        assert utc is not None
        utc_read = await queue.get_job(utc.id)
        async with queue.connection() as c:
            await c.execute("SET TimeZone = 'Europe/Berlin'")
        berlin = await queue.enqueue("t", {})
        assert berlin is not None
        berlin_read = await queue.get_job(berlin.id)
        async with queue.connection() as c:
            cur = await c.execute("SHOW timezone")
            assert await cur.fetchone() == ("Europe/Berlin",)
    finally:
        await queue.close()
        await pool.close()
    assert (utc, berlin) == (utc_read, berlin_read)
    assert [(j.created_at.tzinfo, j.run_after.tzinfo) for j in (utc, berlin)] == [
        (j.created_at.tzinfo, j.run_after.tzinfo) for j in (utc_read, berlin_read)]
    assert (berlin.created_at.tzinfo, berlin.run_after.tzinfo) == (UTC, UTC)
    cur = await aconn.execute(
        sql.SQL("SELECT id, created_at, run_after FROM {}.jobs ORDER BY id").format(
            sql.Identifier(migrated)))
    assert [(j.id, j.created_at, j.run_after) for j in (utc, berlin)] == await cur.fetchall()


async def test_a_connection_whose_date_style_is_not_iso_is_refused_before_anything_is_sent(
    queue: Queue, aconn: AConn,
) -> None:
    """psycopg reads times only as ISO text: on a caller's connection set to another
    DateStyle, enqueue and claim raise ConfigError naming the setting, before the
    statement is sent. Nothing is written: no job, and a queued job stays pending with
    no attempt spent (before, the row was written, or the job claimed, and only then
    did loading its times fail with psycopg's NotImplementedError)."""
    await queue.enqueue("t", {"i": 1})
    jobs = queue.table("jobs")
    async with await psycopg.AsyncConnection.connect(queue.pool.conninfo) as c:
        await c.execute("SET DateStyle = 'SQL, DMY'")
        with pytest.raises(ConfigError, match=r"DateStyle is 'SQL, DMY'.*SET DateStyle TO ISO"):
            await queue.enqueue("t", {"i": 2}, conn=c)
        with pytest.raises(ConfigError, match="DateStyle"):
            await queue.claim("t", 5, conn=c)
        await c.commit()
    cur = await aconn.execute(sql.SQL("SELECT payload, status, attempts FROM {}").format(jobs))
    assert await cur.fetchall() == [({"i": 1}, "pending", 0)]
    # Set back to ISO, the same connection works (the check reads it each time).
    async with await psycopg.AsyncConnection.connect(queue.pool.conninfo) as c:
        await c.execute("SET DateStyle = 'German, DMY'")
        await c.execute("SET DateStyle TO ISO")
        [job] = await queue.claim("t", 5, conn=c)
        await c.commit()
    assert job.payload == {"i": 1} and job.locked_at is not None
    assert job.locked_at.tzinfo is not None


async def test_a_database_whose_date_style_is_not_iso_does_not_reach_rotas_connections(
    database_url: str,
) -> None:
    """A database (or role) set to another DateStyle: rota's own connections start with
    DateStyle ISO (db.SESSION_DEFAULTS), so enqueue, claim and complete work and read
    their times exactly; a URL that asks for another DateStyle itself gets ConfigError,
    and nothing is written."""
    name = f"rota_datestyle_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as c:
        await c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        await c.execute(sql.SQL("ALTER DATABASE {} SET DateStyle = 'German, DMY'")
                        .format(sql.Identifier(name)))
    try:
        url = make_conninfo(database_url, dbname=name)
        async with await psycopg.AsyncConnection.connect(url) as c:
            cur = await c.execute("SHOW DateStyle")
            assert await cur.fetchone() == ("German, DMY",)
        queue = Queue(url, schema="ds")
        async with queue:
            await queue.migrate()
            job = await queue.enqueue("t", {"i": 1})
            assert job is not None and job.created_at.tzinfo is not None
            [claimed] = await queue.claim("t", 1)
            assert claimed.id == job.id and claimed.created_at == job.created_at
            assert await queue.complete_many([claimed]) == [True]
        german = Queue(make_conninfo(url, options="-c DateStyle=German"), schema="ds")
        async with german:
            with pytest.raises(ConfigError, match="DateStyle is 'German, DMY'"):
                await german.enqueue("t", {"i": 2})
        async with await psycopg.AsyncConnection.connect(url) as c:
            cur = await c.execute("SELECT count(*), count(*) FILTER (WHERE status = 'done')"
                                  " FROM ds.jobs")
            assert await cur.fetchone() == (1, 1)
    finally:
        async with await psycopg.AsyncConnection.connect(database_url,
                                                         autocommit=True) as c:
            await c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                            .format(sql.Identifier(name)))
