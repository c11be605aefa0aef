"""Operations that must keep up (docs/design.md, "Maintenance"; docs/operations.md): the
worker fails stuck jobs every minute, not once a day; runs rows are pruned like done
jobs; listings are capped; `rota serve` shows rota's own log lines."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from psycopg import sql

from rota import InvalidInput, Job, Maintenance, PruneDoneJobs, Queue
from rota.admin import MAX_LIST_LIMIT
from rota.cli import cli
from rota.maintenance import DEFAULT_RUNS_RETENTION
from rota.worker import DEFAULT_RESCUE_EVERY, Worker
from tests.cli_app import build_pipeline

AConn = psycopg.AsyncConnection[Any]
SETTINGS: dict[str, Any] = build_pipeline.queue_settings  # type: ignore[attr-defined]


# -- rescue cadence -----------------------------------------------------------------------------


def test_the_worker_rescues_stuck_jobs_every_minute_by_default() -> None:
    """It ran stuck-job handling once a day (River's rescuer: every 30 s)."""
    assert DEFAULT_RESCUE_EVERY == timedelta(minutes=1)
    assert Worker(lambda: None).rescue_every == timedelta(minutes=1)
    assert Worker(lambda: None, rescue_every=None).rescue_every is None
    with pytest.raises(InvalidInput, match="rescue_every must be positive"):
        Worker(lambda: None, rescue_every=timedelta(0))


async def test_a_worker_fails_a_stuck_job_and_closes_a_killed_run_between_maintenance_runs(
    make_queue: Any, aconn: AConn
) -> None:
    """A worker restarted after a SIGKILL closed the killed run only at its next daily
    maintenance (its startup maintenance came too soon): the rescue pass now does."""
    queue: Queue = await make_queue(**SETTINGS)
    hooks: list[int] = []
    killed = uuid.uuid4()  # a run whose process died: unfinished, then silent
    await aconn.execute(sql.SQL(
        "INSERT INTO {} (id, trigger, started_at, heartbeat_at) VALUES (%s, 'worker', "
        "now(), now())").format(queue.table("runs")), [killed])
    await aconn.commit()

    async def refund(job: Job, conn: Any) -> None:
        hooks.append(job.id)

    pipeline = build_pipeline(queue)
    queue.on_give_up("boom", refund)
    job = await pipeline.queue.enqueue("boom", {})  # boom's stage: one attempt
    assert job
    [claimed] = await queue.claim("boom", 1)  # its process dies
    queue.clock_offset = timedelta(minutes=16)  # the lock is stale, no attempt left
    worker = Worker(pipeline, maintain_every=None, rescue_every=timedelta(seconds=0.2),
                    idle_poll=timedelta(seconds=60))
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run_forever(stop))
    try:
        deadline = time.monotonic() + 10
        while worker.last_rescue is None or not worker.last_rescue["stuck_jobs.failed"]:
            assert time.monotonic() < deadline, worker.last_rescue
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    got = await queue.get_job(claimed.id)
    assert got is not None and (got.status, got.give_up_pending) == ("failed", False)
    assert hooks == [claimed.id]
    assert worker.last_rescue == {"stuck_jobs.failed": 1, "stuck_jobs.hooks_run": 0,
                                  "killed_runs.marked": 1}
    cur = await aconn.execute(sql.SQL(
        "SELECT id, stop_reason, error, finished_at = started_at FROM {}").format(
        queue.table("runs")))
    # The rescue writes no runs rows of its own; the killed run ended at its last sign
    # of life.
    assert await cur.fetchall() == [(killed, "error", "killed", True)]


# -- runs rows are pruned ------------------------------------------------------------------------


async def test_finished_runs_past_their_retention_are_pruned(
    queue: Queue, aconn: AConn
) -> None:
    assert DEFAULT_RUNS_RETENTION == timedelta(days=30)
    runs = queue.table("runs")

    async def run_started(days_ago: float, finished: bool) -> uuid.UUID:
        run_id = uuid.uuid4()
        await aconn.execute(sql.SQL(
            "INSERT INTO {} (id, trigger, stop_reason, started_at, finished_at) VALUES "
            "(%s, 'cli', %s, now() - %s * interval '1 day', "
            "CASE WHEN %s THEN now() - %s * interval '1 day' + interval '1 minute' END)")
            .format(runs), [run_id, "no_work" if finished else None, days_ago, finished,
                            days_ago])
        return run_id

    old = [await run_started(d, True) for d in (31, 45, 400)]
    kept = [await run_started(29, True), await run_started(1, True),
            await run_started(40, False)]  # unfinished: for the killed-runs sweep first
    counters = await PruneDoneJobs(queue, batch_size=2).run_once()
    assert counters == {"jobs_deleted": 0, "quota_rows_deleted": 0, "runs_deleted": 3}
    cur = await aconn.execute(sql.SQL("SELECT id FROM {}").format(runs))
    assert {r[0] for r in await cur.fetchall()} == set(kept)
    assert not set(old) & set(kept)
    # Within Maintenance the counter is prune.runs_deleted; a shorter retention applies.
    got = await Maintenance(queue, runs_retention=timedelta(days=2)).run_once()
    assert (got["killed_runs.marked"], got["prune.runs_deleted"]) == (1, 2)


# -- listings are capped ---------------------------------------------------------------------------


async def test_listings_are_capped_at_1000(queue: Queue, database_url: str) -> None:
    """`rota jobs --limit 1000000 --json` is refused (exit 2), as is the library call."""
    assert MAX_LIST_LIMIT == 1000
    with pytest.raises(InvalidInput, match="limit must be between 1 and 1000, got 1000000"):
        await queue.list_jobs(limit=1_000_000)
    with pytest.raises(InvalidInput, match="limit must be between 1 and 1000"):
        await queue.list_runs(limit=1_000_000)

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, list(args), env={
            "DATABASE_URL": database_url, "ROTA_SCHEMA": queue.schema, "ROTA_APP": None})

    for args in (["jobs", "--limit", "1000000", "--json"],
                 ["jobs", "failed", "--limit", "1000000"], ["runs", "-n", "1000000"]):
        result = await asyncio.to_thread(run, *args)
        assert result.exit_code == 2, args
        assert "--limit must be a whole number from 1 to 1,000, got 1000000" in result.stderr
