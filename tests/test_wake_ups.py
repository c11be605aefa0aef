"""The worker wakes at the earliest due time as it stands after each run, within 100 ms
(docs/design.md, "The worker"): a retry's backoff, a deferral, a ``run_after`` and a
schedule's tick each start their job when it is due, not at the next idle poll.

Each worker here has an idle poll of an hour, so a job started on time was woken for,
never polled for. A start is the queue's clock read by the handler as it begins (this
host's clock plus the clock offset: the database runs here), and is compared with the
``run_after`` the job was due at.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rota import DeferJob, JobContext, Pipeline, Queue, Schedule, Stage
from rota.worker import Worker
from tests.test_worker import running

# The window the worker promises: from a job's due time to its handler starting.
WAKE_WINDOW = timedelta(milliseconds=100)

# Run alone by `make test`, after the rest of the suite (pyproject.toml, "timing").
pytestmark = pytest.mark.timing


class Starts:
    """Each handler start: (job id, attempt, the queue's clock at the start)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, datetime]] = []
        self.changed = asyncio.Event()

    async def record(self, ctx: JobContext) -> None:
        # The queue's clock read here, not by a statement: the database is on this host
        # (its now() is this clock), and a round trip to ask it, under the suite's load,
        # added up to tens of milliseconds to the start it measured (119.8 ms once).
        started = datetime.now(UTC) + ctx.queue.clock_offset
        self.rows.append((ctx.job.id, ctx.job.attempts, started))
        self.changed.set()

    async def wait(self, n: int, seconds: float = 10) -> None:
        async def until() -> None:
            while len(self.rows) < n:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(until(), seconds)


@pytest.fixture
async def queue(database_url: str, schema: str) -> AsyncIterator[Queue]:
    q = Queue(database_url, schema=schema, types=["flaky", "plain"],
              backoff_base=timedelta(milliseconds=500))
    await q.open()
    await q.migrate()
    yield q
    await q.close()


def worker(queue: Queue, starts: Starts, **pipeline: Any) -> Worker:
    async def flaky(ctx: JobContext) -> None:
        await starts.record(ctx)
        if ctx.job.attempts == 1 and ctx.job.deferrals == 0:
            if ctx.job.payload["first"] == "fail":
                raise RuntimeError("the first attempt fails")
            raise DeferJob(timedelta(seconds=1))

    p = Pipeline(queue, [Stage("flaky", 5, 1, flaky), Stage("plain", 5, 1, starts.record)],
                 **pipeline)
    return Worker(p, idle_poll=timedelta(hours=1), wake_interval=timedelta(hours=1),
                  maintain_every=None, rescue_every=None)


async def due_at(queue: Queue, job_id: int) -> datetime:
    async with queue.connection() as conn:
        cur = await conn.execute(
            f'SELECT run_after FROM "{queue.schema}".jobs WHERE id = %s', [job_id])
        row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize("first", ["fail", "defer"])
async def test_a_retry_or_a_deferral_starts_within_100_ms_of_its_due_time(
    queue: Queue, first: str,
) -> None:
    """The first attempt fails into a 1 s backoff (500 ms * 2**1) or defers by 1 s: the
    run that did it ends with nothing else due, and the worker sleeps until the new due
    time, read after that run, not the one read before it."""
    starts = Starts()
    async with running(worker(queue, starts)):
        job = await queue.enqueue("flaky", {"first": first})
        assert job is not None
        await starts.wait(2)
        due = await due_at(queue, job.id)
    (_, a1, t1), (_, a2, t2) = starts.rows
    # A retry counts an attempt; a deferral hands it back.
    assert (a1, a2) == ((1, 2) if first == "fail" else (1, 1))
    # Due 1 s after the first attempt settled, which follows its start closely.
    assert timedelta(seconds=1) <= due - t1 < timedelta(seconds=1.5)
    assert timedelta(0) <= t2 - due <= WAKE_WINDOW, t2 - due


async def test_a_job_enqueued_with_run_after_starts_within_100_ms_of_it(
    queue: Queue,
) -> None:
    starts = Starts()
    async with running(worker(queue, starts)):
        due = await queue.now() + timedelta(seconds=1.5)
        job = await queue.enqueue("plain", {}, run_after=due)
        assert job is not None
        await starts.wait(1)
    [(job_id, _, started)] = starts.rows
    assert job_id == job.id
    assert timedelta(0) <= started - due <= WAKE_WINDOW, started - due


async def test_a_schedule_tick_starts_its_job_within_100_ms_of_the_tick(
    queue: Queue,
) -> None:
    """The queue's clock is moved to 1.5 s before a minute turns, so the every-minute
    schedule's next tick comes 1.5 s after the worker falls asleep."""
    now = await queue.now()
    tick = now.replace(second=0, microsecond=0) + timedelta(minutes=2)
    queue.clock_offset = tick - timedelta(seconds=1.5) - now
    starts = Starts()
    w = worker(queue, starts, schedules=[Schedule("minutely", cron="* * * * *", type="plain")])
    async with running(w):
        await starts.wait(1)
    [(job_id, _, started)] = starts.rows
    assert await due_at(queue, job_id) == tick  # the tick's job
    assert timedelta(0) <= started - tick <= WAKE_WINDOW, started - tick
