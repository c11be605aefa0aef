"""Periodic schedules (docs/design.md, "Schedules"): ticks read in the schedule's own zone
across both DST changes, each tick enqueued once however many workers ask at once, a
finished tick never enqueued again by a late worker, the missed-tick policies, the run's
and the worker's hooks, and `rota schedules`. Time moves with the queue's clock_offset,
never by sleeping."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from rota import (
    ConfigError,
    InvalidInput,
    Job,
    JobContext,
    PayloadError,
    Pipeline,
    Queue,
    Schedule,
    Scheduler,
    Stage,
    scheduled_tick,
)
from rota.cli import cli
from rota.worker import Worker

AConn = psycopg.AsyncConnection[Any]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


async def at(queue: Queue, instant: datetime) -> None:
    """Move the queue's clock so that its now() is (a few ms after) ``instant``."""
    queue.clock_offset = instant - (await queue.now() - queue.clock_offset)


async def scheduled_jobs(aconn: AConn, queue: Queue) -> list[tuple[str, str, datetime]]:
    """(type, dedupe_key, run_after) of every job, oldest first."""
    cur = await aconn.execute(sql.SQL("SELECT type, dedupe_key, run_after FROM {} ORDER BY id")
                              .format(queue.table("jobs")))
    return [tuple(r) for r in await cur.fetchall()]  # type: ignore[misc]


async def last_tick(aconn: AConn, queue: Queue, name: str) -> datetime | None:
    cur = await aconn.execute(sql.SQL("SELECT last_tick FROM {} WHERE name = %s")
                              .format(queue.table("schedules")), [name])
    row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def key(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{tick.isoformat()}"


# -- ticks: the schedule's own zone, both DST changes ----------------------------------------

# (zone, cron, from, to, every tick in between in UTC). 2025: Europe/Paris springs forward
# on 30 March at 02:00 (CET to CEST) and falls back on 26 October at 03:00; New York
# springs forward on 9 March at 02:00 (EST to EDT) and falls back on 2 November at 02:00.
DST_CASES = [
    pytest.param("Europe/Paris", "30 2 * * *", utc(2025, 3, 28, 12), utc(2025, 4, 1, 12), [
        utc(2025, 3, 29, 1, 30),   # 02:30 CET
        utc(2025, 3, 30, 1, 0),    # 02:30 does not exist: once, at 03:00 CEST
        utc(2025, 3, 31, 0, 30),   # 02:30 CEST
        utc(2025, 4, 1, 0, 30),
    ], id="paris-spring-forward-0230"),
    pytest.param("Europe/Paris", "30 2 * * *", utc(2025, 10, 24, 12), utc(2025, 10, 28, 12), [
        utc(2025, 10, 25, 0, 30),  # 02:30 CEST
        utc(2025, 10, 26, 0, 30),  # 02:30 happens twice: once, at the first (CEST)
        utc(2025, 10, 27, 1, 30),  # 02:30 CET
        utc(2025, 10, 28, 1, 30),
    ], id="paris-fall-back-0230"),
    pytest.param("America/New_York", "30 2 * * *", utc(2025, 3, 7, 12), utc(2025, 3, 11, 12), [
        utc(2025, 3, 8, 7, 30),    # 02:30 EST
        utc(2025, 3, 9, 7, 0),     # 02:30 does not exist: once, at 03:00 EDT
        utc(2025, 3, 10, 6, 30),   # 02:30 EDT
        utc(2025, 3, 11, 6, 30),
    ], id="new-york-spring-forward-0230"),
    pytest.param("America/New_York", "30 1 * * *", utc(2025, 10, 31, 12), utc(2025, 11, 4, 12), [
        utc(2025, 11, 1, 5, 30),   # 01:30 EDT
        utc(2025, 11, 2, 5, 30),   # 01:30 happens twice: once, at the first (EDT)
        utc(2025, 11, 3, 6, 30),   # 01:30 EST
        utc(2025, 11, 4, 6, 30),
    ], id="new-york-fall-back-0130"),
    pytest.param("America/New_York", "30 * * * *", utc(2025, 11, 2, 4), utc(2025, 11, 2, 8), [
        utc(2025, 11, 2, 4, 30),   # 00:30 EDT
        utc(2025, 11, 2, 5, 30),   # 01:30 EDT
        utc(2025, 11, 2, 6, 30),   # 01:30 EST: an hourly schedule runs every real hour
        utc(2025, 11, 2, 7, 30),   # 02:30 EST
    ], id="new-york-fall-back-hourly"),
]


@pytest.mark.parametrize(("zone", "cron", "start", "end", "expected"), DST_CASES)
def test_ticks_are_read_in_the_schedules_zone_across_dst(
        zone: str, cron: str, start: datetime, end: datetime, expected: list[datetime]) -> None:
    s = Schedule("s", cron=cron, type="digest", tz=zone)
    assert list(s.ticks(start, end)) == expected
    # Asked from inside the change (the repeated hour, the skipped one), the next tick
    # is still the next of the list: none is named twice or missed.
    for inside in (expected[1] + timedelta(minutes=m) for m in (1, 31, 59, 61, 89)):
        assert s.next_tick(inside) == next(t for t in expected if t > inside)


@pytest.mark.parametrize(("zone", "cron", "start", "end", "expected"), DST_CASES)
async def test_a_run_every_half_hour_across_dst_enqueues_each_tick_once(
        make_queue: Any, aconn: AConn, zone: str, cron: str, start: datetime, end: datetime,
        expected: list[datetime]) -> None:
    queue = await make_queue(types=["digest"])
    scheduler = Scheduler(queue, [Schedule("digest", cron=cron, type="digest", tz=zone)])
    step = start + timedelta(minutes=10)  # never on a tick: ticks are at :00 and :30
    while step <= end:
        await at(queue, step)
        await scheduler.run_once()
        step += timedelta(minutes=30)
    assert await scheduled_jobs(aconn, queue) == [
        ("digest", key("digest", t), t) for t in expected]


# -- exactly once across workers ------------------------------------------------------------


@pytest.fixture
async def eight_queues(database_url: str, schema: str) -> AsyncIterator[list[Queue]]:
    """Eight queues on one schema, each with its own pool: eight workers on eight hosts."""
    queues = [Queue(database_url, schema=schema, types=["digest"]) for _ in range(8)]
    for q in queues:
        await q.open()
    await queues[0].migrate()
    yield queues
    for q in queues:
        await q.close()


async def test_eight_workers_asking_for_the_same_tick_at_once_create_one_job(
        eight_queues: list[Queue], aconn: AConn, monkeypatch: pytest.MonkeyPatch) -> None:
    hourly = Schedule("hourly", cron="0 * * * *", type="digest", payload={"k": 1})
    schedulers = [Scheduler(q, [hourly]) for q in eight_queues]
    takers: list[tuple[int, int]] = []  # each worker that saw the tick due and went for it
    take = Scheduler._take

    async def counted_take(self: Scheduler, schedule: Schedule, now: datetime) -> Any:
        took = await take(self, schedule, now)
        takers.append(took)
        return took

    monkeypatch.setattr(Scheduler, "_take", counted_take)
    base = utc(2030, 1, 1, 9, 50)
    for q in eight_queues:
        await at(q, base)
    # The first sight races too: one row, and no tick owed from before it.
    assert await asyncio.gather(*(s.run_once() for s in schedulers)) == \
        [{"enqueued": 0, "skipped": 0}] * 8
    for hour in range(10, 16):
        for q in eight_queues:
            await at(q, utc(2030, 1, 1, hour, 0, 5))
        takers.clear()
        counters = await asyncio.gather(*(s.run_once() for s in schedulers))
        assert sorted(c["enqueued"] for c in counters) == [0] * 7 + [1], hour
        # The race happened: several workers saw the tick due and went for its row;
        # one took it, the others found it taken under the lock.
        assert len(takers) >= 2 and sorted(takers)[-1] == (1, 0), (hour, takers)
    assert await scheduled_jobs(aconn, eight_queues[0]) == [
        ("digest", key("hourly", utc(2030, 1, 1, h)), utc(2030, 1, 1, h))
        for h in range(10, 16)]


async def test_a_late_worker_never_enqueues_a_tick_whose_job_already_finished(
        make_queue: Any, aconn: AConn) -> None:
    queue = await make_queue(types=["digest"])
    late_queue = await make_queue(types=["digest"])
    hourly = Schedule("hourly", cron="0 * * * *", type="digest")
    first, late = Scheduler(queue, [hourly]), Scheduler(late_queue, [hourly])
    await at(queue, utc(2030, 1, 1, 9, 50))
    await first.run_once()
    await at(queue, utc(2030, 1, 1, 10, 1))
    await at(late_queue, utc(2030, 1, 1, 10, 1))
    # The late worker read the state before the tick was taken...
    now, state = await late._state()
    assert hourly.due(state[0][1], now)[0] == [utc(2030, 1, 1, 10)]  # type: ignore[arg-type]
    # ...then the first worker took it, and the job ran and finished: outside the
    # dedupe index, which covers open jobs only.
    assert await first.run_once() == {"enqueued": 1, "skipped": 0}
    [job] = await queue.claim("digest", 10)
    assert await queue.complete(job)
    # The late worker goes on with what it read: under the row's lock it finds the tick
    # taken, and enqueues nothing, now or at its next run.
    assert await late._take(hourly, now) == (0, 0)
    assert await late.run_once() == {"enqueued": 0, "skipped": 0}
    assert [k for _, k, _ in await scheduled_jobs(aconn, queue)] == [
        key("hourly", utc(2030, 1, 1, 10))]


# -- missed ticks ---------------------------------------------------------------------------


async def down_from_10_to_15(make_queue: Any, aconn: AConn, schedule: Schedule,
                             ) -> tuple[Queue, Scheduler, dict[str, int]]:
    """First seen at 10:10; nothing runs until 15:20 (ticks 11:00 to 15:00 missed)."""
    queue = await make_queue(types=["digest"])
    scheduler = Scheduler(queue, [schedule])
    await at(queue, utc(2030, 1, 1, 10, 10))
    assert await scheduler.run_once() == {"enqueued": 0, "skipped": 0}
    await at(queue, utc(2030, 1, 1, 15, 20))
    return queue, scheduler, await scheduler.run_once()


async def test_a_worker_down_across_several_ticks_runs_only_the_latest(
        make_queue: Any, aconn: AConn) -> None:
    hourly = Schedule("hourly", cron="0 * * * *", type="digest")
    queue, scheduler, counters = await down_from_10_to_15(make_queue, aconn, hourly)
    assert counters == {"enqueued": 1, "skipped": 0}
    assert await scheduled_jobs(aconn, queue) == [
        ("digest", key("hourly", utc(2030, 1, 1, 15)), utc(2030, 1, 1, 15))]
    assert await last_tick(aconn, queue, "hourly") == utc(2030, 1, 1, 15)
    assert await scheduler.run_once() == {"enqueued": 0, "skipped": 0}
    await at(queue, utc(2030, 1, 1, 16, 0, 1))
    assert await scheduler.run_once() == {"enqueued": 1, "skipped": 0}
    assert len(await scheduled_jobs(aconn, queue)) == 2


@pytest.mark.parametrize(("max_catch_up", "hours"), [(None, [11, 12, 13, 14, 15]),
                                                      (3, [13, 14, 15])])
async def test_missed_all_enqueues_every_missed_tick_up_to_its_bound(
        make_queue: Any, aconn: AConn, max_catch_up: int | None, hours: list[int]) -> None:
    hourly = Schedule("hourly", cron="0 * * * *", type="digest", missed="all",
                      max_catch_up=max_catch_up)
    queue, _, counters = await down_from_10_to_15(make_queue, aconn, hourly)
    assert counters == {"enqueued": len(hours), "skipped": 0}
    assert await scheduled_jobs(aconn, queue) == [
        ("digest", key("hourly", utc(2030, 1, 1, h)), utc(2030, 1, 1, h)) for h in hours]


async def test_missed_skip_drops_late_ticks_and_runs_the_next_on_time(
        make_queue: Any, aconn: AConn) -> None:
    hourly = Schedule("hourly", cron="0 * * * *", type="digest", missed="skip",
                      grace=timedelta(minutes=5))
    queue, scheduler, counters = await down_from_10_to_15(make_queue, aconn, hourly)
    assert counters == {"enqueued": 0, "skipped": 1}
    assert await scheduled_jobs(aconn, queue) == []
    assert await last_tick(aconn, queue, "hourly") == utc(2030, 1, 1, 15)
    await at(queue, utc(2030, 1, 1, 16, 4))
    assert await scheduler.run_once() == {"enqueued": 1, "skipped": 0}
    assert await scheduled_jobs(aconn, queue) == [
        ("digest", key("hourly", utc(2030, 1, 1, 16)), utc(2030, 1, 1, 16))]


async def test_a_new_schedule_owes_no_tick_from_before_it_was_first_seen(
        make_queue: Any, aconn: AConn) -> None:
    queue = await make_queue(types=["digest"])
    scheduler = Scheduler(queue, [Schedule("daily", cron="@daily", type="digest")])
    await at(queue, utc(2030, 1, 1, 12))
    assert await scheduler.run_once() == {"enqueued": 0, "skipped": 0}
    await at(queue, utc(2030, 1, 1, 23, 59))
    assert await scheduler.run_once() == {"enqueued": 0, "skipped": 0}
    await at(queue, utc(2030, 1, 2, 0, 0, 1))
    assert await scheduler.run_once() == {"enqueued": 1, "skipped": 0}


@settings(max_examples=200, deadline=None)
@given(cron=st.sampled_from(["* * * * *", "*/7 * * * *", "30 2 * * *", "30 1 * * *",
                             "0 0 29 2 *", "15 2,3 * * 0", "0 9-17 * * 1-5"]),
       zone=st.sampled_from(["Europe/Paris", "America/New_York", "Australia/Lord_Howe",
                             "UTC"]),
       start=st.datetimes(min_value=datetime(2023, 1, 1), max_value=datetime(2027, 1, 1),
                          timezones=st.just(UTC)),
       gap=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=3)),
       limit=st.integers(1, 5))
def test_recent_ticks_are_the_last_of_every_tick_in_the_window(
        cron: str, zone: str, start: datetime, gap: timedelta, limit: int) -> None:
    s = Schedule("s", cron=cron, type="t", tz=zone)
    assert s.recent_ticks(start, start + gap, limit) == \
        list(s.ticks(start, start + gap))[-limit:]


# -- the run and the worker -----------------------------------------------------------------


async def digest(ctx: JobContext) -> None:
    tick = scheduled_tick(ctx.job)
    assert tick is not None
    ctx.count(f"digest {tick.isoformat()}")


def build_scheduled(queue: Queue) -> Pipeline:
    """The app of the CLI test (``--app tests.test_schedule:build_scheduled``)."""
    return Pipeline(queue, [Stage("digest", 10, 1, digest)], schedules=[
        Schedule("hourly-digest", cron="0 * * * *", type="digest"),
        Schedule("nightly-digest", cron="0 3 * * *", type="digest", payload={"n": 1},
                 tz="Europe/Paris"),
    ])


async def test_each_run_starts_by_enqueueing_the_due_ticks(make_queue: Any) -> None:
    queue = await make_queue(types=["digest"])
    pipeline = build_scheduled(queue)
    await at(queue, utc(2030, 1, 1, 1, 30))
    first = await pipeline.run(trigger="manual", time_budget=timedelta(seconds=60))
    assert first.jobs_done == 0 and first.summary == {}
    await at(queue, utc(2030, 1, 1, 2, 0, 3))  # 03:00 in Paris, and an hour
    result = await pipeline.run(trigger="manual", time_budget=timedelta(seconds=60))
    assert result.jobs_done == 2
    assert result.summary == {"schedules.enqueued": 2,
                              "digest 2030-01-01T02:00:00+00:00": 2}


def test_pipeline_refuses_schedules_it_cannot_run() -> None:
    queue = Queue("postgresql://unused@127.0.0.1:1/x", types=["digest", "other"])
    stages = [Stage("digest", 1, 1, digest)]
    with pytest.raises(ConfigError, match="enqueues 'other', which no stage"):
        Pipeline(queue, stages, schedules=[Schedule("a", cron="@daily", type="other")])
    with pytest.raises(ConfigError, match="two schedules are named 'a'"):
        Pipeline(queue, stages, schedules=[Schedule("a", cron="@daily", type="digest"),
                                           Schedule("a", cron="@hourly", type="digest")])
    with pytest.raises(InvalidInput, match="unknown job type 'nope'"):
        Pipeline(queue, stages, schedules=[Schedule("a", cron="@daily", type="nope")])
    with pytest.raises(PayloadError, match="schedule 'a': "):
        Pipeline(Queue("postgresql://unused@127.0.0.1:1/x", max_payload_bytes=10), stages,
                 schedules=[Schedule("a", cron="@daily", type="digest",
                                     payload={"long": "x" * 20})])


async def test_an_idle_worker_wakes_in_time_for_the_next_tick(
        make_queue: Any, aconn: AConn) -> None:
    queue = await make_queue(types=["digest"])
    pipeline = build_scheduled(queue)
    await at(queue, utc(2030, 1, 1, 1, 59))
    await pipeline.scheduler.run_once()  # first seen: the 02:00 UTC ticks are owed
    # Half a second before 03:00 in Paris (and an hour): with nothing queued, only the
    # schedules can cut the worker's minute-long idle sleep short.
    await at(queue, utc(2030, 1, 1, 2) - timedelta(seconds=0.5))
    worker = Worker(pipeline, idle_poll=timedelta(seconds=60), maintain_every=None)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run_forever(stop))
    try:
        for _ in range(100):
            if worker.runs:
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    assert worker.runs == 1 and worker.last_result.jobs_done == 2
    assert [k for _, k, _ in await scheduled_jobs(aconn, queue)] == [
        key("hourly-digest", utc(2030, 1, 1, 2)), key("nightly-digest", utc(2030, 1, 1, 2))]


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "nightly digest"}, "schedule name 'nightly digest' must be 1-100 letters"),
    ({"name": "a:b"}, "schedule name 'a:b' must be"),
    ({"name": ""}, "schedule name '' must be"),
    ({"name": "x" * 101}, "must be 1-100 letters"),
    ({"cron": "0 3 * *"}, "cron '0 3 * *' must have five fields (minute hour"),
    ({"cron": "0 0 3 * * *"}, "must have five fields"),
    ({"cron": "61 3 * * *"}, "cron '61 3 * * *' is not valid: Bad minute"),
    ({"cron": "0 0 30 2 *"}, "is not valid: Bad day-of-month"),
    ({"cron": "@often"}, "must have five fields"),
    ({"cron": None}, "cron must be a string, got NoneType"),
    ({"tz": "Europe/Pariss"}, "tz: unknown time zone 'Europe/Pariss' (use an IANA name"),
    ({"tz": ""}, "tz must be a time zone name"),
    ({"type": ""}, "type must be a non-empty string"),
    ({"missed": "first"}, "missed must be one of 'latest', 'all', 'skip', got 'first'"),
    ({"max_catch_up": 5}, "max_catch_up applies to missed='all' only"),
    ({"missed": "all", "max_catch_up": 0}, "max_catch_up must be an int >= 1"),
    ({"missed": "all", "max_catch_up": 1001}, "max_catch_up must be at most 1000"),
    ({"grace": timedelta(minutes=1)}, "grace applies to missed='skip' only"),
    ({"missed": "skip", "grace": timedelta(0)}, "grace must be positive"),
    ({"payload": {"x": float("nan")}}, "schedule 'nightly-digest': "),
])
def test_bad_schedules_are_refused_with_a_clear_message(kwargs: dict[str, Any],
                                                         message: str) -> None:
    args: dict[str, Any] = {"name": "nightly-digest", "cron": "0 3 * * *", "type": "digest",
                            "tz": "Europe/Paris", **kwargs}
    with pytest.raises(InvalidInput) as err:
        Schedule(args.pop("name"), **args)
    assert message in str(err.value)


def test_scheduled_tick_reads_the_tick_back_and_ignores_other_keys() -> None:
    def job(dedupe_key: str | None) -> Job:
        t = utc(2025, 1, 1)
        return Job(1, "digest", None, {}, dedupe_key, "pending", 0, 3, 0, t, None, None,
                   None, None, t, None, False)

    s = Schedule("nightly-digest", cron="0 3 * * *", type="digest", tz="Europe/Paris")
    tick = utc(2025, 3, 30, 1)
    assert s.dedupe_key(tick) == "schedule:nightly-digest:2025-03-30T01:00:00+00:00"
    assert scheduled_tick(job(s.dedupe_key(tick))) == tick
    for other in (None, "digest:42", "schedule:x", "schedule:x:not-a-time",
                  "schedule:x:2025-03-30T01:00:00"):
        assert scheduled_tick(job(other)) is None


# -- rota schedules -------------------------------------------------------------------------


def test_rota_schedules_lists_last_and_next_ticks(database_url: str, schema: str) -> None:
    env = {"DATABASE_URL": database_url, "ROTA_SCHEMA": schema, "ROTA_APP": None,
           "COLUMNS": "250"}
    app = "tests.test_schedule:build_scheduled"

    def rota(*args: str, code: int = 0) -> Any:
        result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
        assert result.exit_code == code, (result.stdout, result.stderr)
        return result

    rota("migrate")
    with psycopg.connect(database_url, autocommit=True) as conn:
        table = sql.Identifier(schema, "schedules")
        before = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        # hourly-digest last took a tick three hours ago, so one is due; old-report is
        # a row left by a schedule the app no longer declares.
        conn.execute(sql.SQL(
            "INSERT INTO {} (name, last_tick, created_at, updated_at) VALUES "
            "('hourly-digest', date_trunc('hour', now()) - interval '3 hours', "
            " now() - interval '1 day', now()), "
            "('old-report', '2024-01-01T00:00:00Z', '2023-01-01T00:00:00Z', now())"
        ).format(table))
        hourly_last = conn.execute(sql.SQL("SELECT last_tick FROM {} WHERE name = %s")
                                   .format(table), ["hourly-digest"]).fetchone()[0]  # type: ignore[index]
        got = json.loads(rota("schedules", "--app", app, "--json").stdout)
        after = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]

    def instant(text: str | None) -> datetime | None:
        return None if text is None else datetime.fromisoformat(text)

    assert [(r["name"], r["declared"], r["due"]) for r in got] == [
        ("hourly-digest", True, True), ("nightly-digest", True, False),
        ("old-report", False, False)]
    hourly, nightly, old = got
    assert instant(hourly["last_tick"]) == hourly_last
    # The next tick after the queue's clock, which lies between the two reads.
    for row, cron, zone in ((hourly, "0 * * * *", "UTC"),
                            (nightly, "0 3 * * *", "Europe/Paris")):
        s = Schedule("n", cron=cron, type="t", tz=zone)
        assert instant(row["next_tick"]) in {s.next_tick(before), s.next_tick(after)}
    assert (nightly["cron"], nightly["tz"], nightly["type"], nightly["missed"],
            nightly["last_tick"], nightly["created_at"]) == (
        "0 3 * * *", "Europe/Paris", "digest", "latest", None, None)
    assert (old["cron"], old["next_tick"], instant(old["last_tick"])) == (
        None, None, utc(2024, 1, 1))

    text = rota("schedules", "--app", app).stdout
    assert "schedules (3)" in text and "due now" in text and "(not declared by the app)" in text
    assert "Europe/Paris" in text
    # The schedules are the app's: without one, one line naming both ways to give it.
    no_app = rota("schedules", code=2)
    assert (no_app.stdout, no_app.stderr) == (
        "", "error: no app: pass --app module:attribute or set ROTA_APP\n")
