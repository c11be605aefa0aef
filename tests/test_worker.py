"""The long-running worker: wakes on enqueue (LISTEN/NOTIFY), sleeps until the next job
is due, falls back to polling, survives dropped connections, and stops when told."""

from __future__ import annotations

import asyncio
import contextlib
import time
import types
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from rota import ConfigError, Queue
from rota.worker import Worker
from tests.cli_app import build_pipeline

SETTINGS: dict[str, Any] = build_pipeline.queue_settings  # type: ignore[attr-defined]


@pytest.fixture
async def tagged(database_url: str, schema: str) -> AsyncIterator[tuple[Queue, str]]:
    """A migrated queue whose connections carry a unique application_name, so a test can
    drop exactly this worker's connections (the database may be shared)."""
    tag = f"rota-test-{uuid.uuid4().hex[:10]}"
    q = Queue(make_conninfo(database_url, application_name=tag), schema=schema, **SETTINGS)
    await q.open()
    await q.migrate()
    yield q, tag
    await q.close()


async def start(worker: Worker) -> tuple[asyncio.Event, asyncio.Task[None]]:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run_forever(stop))
    await asyncio.wait_for(worker.listening.wait(), 10)
    await asyncio.sleep(0.3)  # let it finish its first look and fall asleep
    return stop, task


async def stop_worker(stop: asyncio.Event, task: asyncio.Task[None]) -> float:
    t0 = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 5)
    return time.monotonic() - t0


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[None]:
    """The worker running (started as `start` does) for the block, stopped after it."""
    stop, task = await start(worker)
    try:
        yield
    finally:
        await stop_worker(stop, task)


async def wait_done(aconn: psycopg.AsyncConnection[Any], schema: str, job_id: int,
                    seconds: float = 10) -> tuple[Any, ...]:
    """Poll until the job is done; returns (created_at, run_after, finished_at)."""
    q = sql.SQL("SELECT status, created_at, run_after, finished_at FROM {}.jobs "
                "WHERE id = %s").format(sql.Identifier(schema))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = await (await aconn.execute(q, [job_id])).fetchone()
        assert row is not None
        if row[0] == "done":
            return tuple(row[1:])
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} not done after {seconds}s: {row}")


async def enqueue_elsewhere(aconn: psycopg.AsyncConnection[Any], schema: str,
                            job_type: str = "echo") -> int:
    """Enqueue the way an application does, on its own connection."""
    cur = await aconn.execute(sql.SQL(
        "INSERT INTO {}.jobs (type, payload, max_attempts, run_after, created_at) "
        "VALUES (%s, '{{}}', 3, now(), now()) RETURNING id").format(sql.Identifier(schema)),
        [job_type])
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def assert_picked_up_within(aconn: psycopg.AsyncConnection[Any], schema: str,
                                  seconds: float) -> None:
    """Enqueue elsewhere; the worker has the job done within `seconds` of its creation."""
    job_id = await enqueue_elsewhere(aconn, schema)
    created_at, _, finished_at = await wait_done(aconn, schema, job_id)
    assert finished_at - created_at < timedelta(seconds=seconds)


def echo_worker(queue: Queue, idle_poll: float = 60, **options: Any) -> Worker:
    """A worker on the echo app, with no maintenance runs unless asked for."""
    options.setdefault("maintain_every", None)
    return Worker(build_pipeline(queue), idle_poll=timedelta(seconds=idle_poll), **options)


async def test_worker_wakes_within_a_second_of_an_enqueue_and_stops_on_request(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    queue, _ = tagged
    # A minute of idle poll: only the notification can explain a quick pick-up.
    worker = echo_worker(queue)
    stop, task = await start(worker)
    assert worker.runs == 0  # nothing was due: an idle worker writes no runs rows
    for _ in range(3):
        await assert_picked_up_within(aconn, schema, 1)
        await asyncio.sleep(0.2)
    assert await stop_worker(stop, task) < 1.0
    cur = await aconn.execute(sql.SQL(
        "SELECT trigger, stop_reason, jobs_done FROM {}.runs ORDER BY started_at").format(
        sql.Identifier(schema)))
    assert await cur.fetchall() == [("worker", "no_work", 1)] * 3


async def test_a_notification_waits_only_after_a_look_that_found_nothing_to_run(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    """With an hour of wake_interval and of idle poll, each enqueue is still started on
    its notification, since each look before it ran a job; a bare notification's look
    finds nothing, and the next notification then waits out the interval."""
    queue, _ = tagged
    worker = echo_worker(queue, idle_poll=3600, wake_interval=timedelta(hours=1))
    looks = 0
    looked = asyncio.Event()
    next_due = worker._next_due

    async def counted(*args: Any) -> float | None:
        nonlocal looks
        looks += 1
        looked.set()
        return await next_due(*args)

    worker._next_due = counted  # type: ignore[method-assign]
    async with running(worker):
        for _ in range(3):
            await wait_done(aconn, schema, await enqueue_elsewhere(aconn, schema))
        await asyncio.sleep(0.3)  # its look after the last run is over: it sleeps
        before = looks
        looked.clear()
        await aconn.execute("SELECT pg_notify(%s, 'nothing')", [schema])
        await asyncio.wait_for(looked.wait(), 10)
        await asyncio.sleep(0.1)  # the look's answer is in
        assert looks == before + 1
        held = await enqueue_elsewhere(aconn, schema)
        await asyncio.sleep(1.0)
        row = await (await aconn.execute(sql.SQL("SELECT status FROM {}.jobs WHERE id = %s")
                                         .format(sql.Identifier(schema)), [held])).fetchone()
        assert row == ("pending",)
        assert looks == before + 1
    assert worker.runs == 3


async def test_worker_sleeps_until_the_next_job_is_due(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    queue, _ = tagged
    async with running(echo_worker(queue)):
        now = await queue.now()
        job = await queue.enqueue("echo", {}, run_after=now + timedelta(seconds=1.5))
        assert job is not None
        _, run_after, finished_at = await wait_done(aconn, schema, job.id)
        assert run_after <= finished_at < run_after + timedelta(seconds=1)


async def test_polling_fallback_finds_jobs_no_notification_announced(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    queue, _ = tagged
    await aconn.execute(sql.SQL("ALTER TABLE {}.jobs DISABLE TRIGGER jobs_notify_inserted")
                        .format(sql.Identifier(schema)))
    async with running(echo_worker(queue, idle_poll=0.4)):
        await assert_picked_up_within(aconn, schema, 1.5)


async def test_worker_survives_its_connections_being_dropped(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    """What a database restart does to a worker: every connection it has is cut."""
    queue, tag = tagged
    worker = echo_worker(queue, reconnect_delay=timedelta(seconds=0.1))
    async with running(worker):
        first_pid = worker.listen_pid
        cur = await aconn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s", [tag])
        row = await cur.fetchone()
        assert row is not None and row[0] >= 2  # the listener and the pool's connection
        for _ in range(200):  # the listener reconnects (10 s at most)
            if worker.listen_pid not in (None, first_pid):
                break
            await asyncio.sleep(0.05)
        assert worker.listen_pid not in (None, first_pid)
        await assert_picked_up_within(aconn, schema, 3)


async def test_worker_runs_maintenance_into_a_run_summary(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    queue, _ = tagged
    seen: list[Any] = []
    worker = Worker(build_pipeline(queue), idle_poll=timedelta(seconds=60),
                    on_run=seen.append)
    stop, task = await start(worker)
    await stop_worker(stop, task)
    assert worker.last_maintenance == {
        "stuck_jobs.failed": 0, "stuck_jobs.hooks_run": 0, "killed_runs.marked": 0,
        "prune.jobs_deleted": 0, "prune.quota_rows_deleted": 0,
        "prune.runs_deleted": 0}
    assert len(seen) == 1 and seen[0].summary == {
        f"maintenance.{k}": 0 for k in worker.last_maintenance}
    cur = await aconn.execute(sql.SQL("SELECT trigger, stop_reason FROM {}.runs").format(
        sql.Identifier(schema)))
    assert await cur.fetchall() == [("worker", "no_work")]


async def test_worker_backs_off_a_run_that_raises_and_keeps_going(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    queue, _ = tagged
    real = build_pipeline(queue)

    class Flaky:
        stages = real.stages
        calls = 0

        async def run(self, *, trigger: Any, time_budget: timedelta) -> Any:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            return await real.run(trigger=trigger, time_budget=time_budget)

    worker = Worker(Flaky(), queue=queue, idle_poll=timedelta(seconds=60),
                    maintain_every=None, reconnect_delay=timedelta(seconds=0.2))
    async with running(worker):
        await assert_picked_up_within(aconn, schema, 2)
        assert Flaky.calls >= 2


async def test_a_retried_job_wakes_the_worker_too(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    """`rota jobs retry` is an UPDATE, not an INSERT: its statement notifies itself."""
    queue, _ = tagged
    worker = echo_worker(queue)
    job_id = await enqueue_elsewhere(aconn, schema)
    await aconn.execute(sql.SQL("UPDATE {}.jobs SET status = 'failed', finished_at = now() "
                                "WHERE id = %s").format(sql.Identifier(schema)), [job_id])
    async with running(worker):
        cur = await aconn.execute(queue.sql("retry_job"), {
            "id": job_id, "offset": timedelta(0), "channel": schema})
        assert (await cur.fetchone()) is not None
        retried_at = await queue.now()
        _, _, finished_at = await wait_done(aconn, schema, job_id)
        assert finished_at - retried_at < timedelta(seconds=1)


async def test_a_stop_requested_during_the_maintenance_run_starts_no_other_run(
    tagged: tuple[Queue, str], aconn: psycopg.AsyncConnection[Any], schema: str,
) -> None:
    queue, _ = tagged
    await enqueue_elsewhere(aconn, schema)  # due work: the loop would start a run for it
    stop = asyncio.Event()
    calls: list[bool] = []

    class StoppedMidRun:
        stages = build_pipeline(queue).stages

        async def run(self, *, trigger: Any, time_budget: timedelta,
                      maintenance: Any = None) -> Any:
            calls.append(maintenance is not None)
            stop.set()  # SIGTERM arrives while this run is in progress
            return types.SimpleNamespace(
                run_id=uuid.uuid4(), stop_reason="time_budget", jobs_done=1, jobs_failed=0,
                jobs_deferred=0, quota_units=0, summary={}, error=None)

    worker = Worker(StoppedMidRun(), queue=queue, idle_poll=timedelta(seconds=60))
    await asyncio.wait_for(worker.run_forever(stop), 5)
    assert calls == [True]  # the maintenance run only


async def test_a_budget_not_below_the_platform_timeout_is_refused_at_start(
    tagged: tuple[Queue, str],
) -> None:
    queue, _ = tagged
    worker = Worker(build_pipeline(queue), time_budget=timedelta(seconds=300))
    with pytest.raises(ConfigError, match=r"time_budget \(300 seconds\) must be shorter"):
        await asyncio.wait_for(worker.run_forever(asyncio.Event()), 5)
    assert worker.runs == 0


async def test_an_unmigrated_schema_ends_the_loop_instead_of_retrying_forever(
    database_url: str, schema: str,
) -> None:
    async with Queue(database_url, schema=schema, **SETTINGS) as queue:
        worker = Worker(build_pipeline(queue), maintain_every=None,
                        reconnect_delay=timedelta(seconds=0.05))
        with pytest.raises(psycopg.errors.UndefinedTable):
            await asyncio.wait_for(worker.run_forever(asyncio.Event()), 5)
