"""Across a failover (docs/operations.md, "Poolers and failover"): a worker and an
enqueuer on a multi-host URL (``target_session_attrs=read-write``) in front of a real
primary and its synchronous streaming replica. The primary is stopped at once and the
replica promoted: every acknowledged enqueue is on the new primary, claims resume
within 10 s of the promotion, no job stays running, and each give-up hook ran exactly
once. And a primary turned read-only under open connections (SQLSTATE 25006, as after
a managed failover that keeps the old sockets open): the worker drops those
connections and goes on on the new primary, without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from rota import JobContext, Pipeline, Queue, Stage
from rota.worker import Worker
from tests import replicas
from tests.replicas import ReplicatedPair

pytestmark = pytest.mark.skipif(not replicas.available(),
                                reason="the PostgreSQL server binaries are not installed")

SCHEMA = "failover"


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    with ReplicatedPair() as p:
        yield p


async def gave_up(job: Any, conn: psycopg.AsyncConnection[Any]) -> None:
    # In the give-up transaction: a row per run of the hook.
    await conn.execute("INSERT INTO failover.gave_up (job_id) VALUES (%s)", [job.id])


async def echo(ctx: JobContext) -> None:
    await asyncio.sleep(0.01)


async def boom(ctx: JobContext) -> None:
    raise RuntimeError("boom")


def pipeline(queue: Queue) -> Pipeline:
    return Pipeline(queue, [
        Stage("echo", 10, 4, echo),
        Stage("boom", 5, 2, boom, max_attempts=1, on_give_up=gave_up),
    ], platform_timeout=timedelta(seconds=4))


@contextlib.asynccontextmanager
async def working(url: str) -> AsyncIterator[
        tuple[Queue, Worker, list[int], asyncio.Event]]:
    """A worker, and an enqueuer adding an echo job every 10 ms and a boom job every
    tenth, each on its own queue on ``url``; yields the worker's queue, the worker,
    the ids of acknowledged enqueues and the event that stops the enqueuer."""
    # A job in flight when the run stops in error (a server turned read-only under it)
    # fails that attempt ("the run stopped while the job was running") and is retried
    # after its backoff: 2 s here, so the test sees it done.
    queue = Queue(url, schema=SCHEMA, stale_after=timedelta(seconds=6),
                  backoff_base=timedelta(seconds=1))
    await queue.migrate()
    async with queue.connection() as c:
        await c.execute("CREATE TABLE failover.gave_up (job_id bigint NOT NULL)")
    worker = Worker(pipeline(queue), idle_poll=timedelta(seconds=1), maintain_every=None,
                    rescue_every=timedelta(seconds=1),
                    reconnect_delay=timedelta(seconds=0.1))
    enqueuer = Queue(url, schema=SCHEMA)
    acknowledged: list[int] = []
    stop, halt = asyncio.Event(), asyncio.Event()

    async def enqueue() -> None:
        n = 0
        while not stop.is_set() and not halt.is_set():
            n += 1
            try:
                boom = n % 10 == 0  # one attempt: it gives up at once
                job = await enqueuer.enqueue("boom" if boom else "echo", {"n": n},
                                             max_attempts=1 if boom else None)
            except (psycopg.Error, OSError):  # not acknowledged: the next one is tried
                await asyncio.sleep(0.05)
                continue
            assert job is not None
            acknowledged.append(job.id)
            await asyncio.sleep(0.01)

    tasks = [asyncio.create_task(worker.run_forever(stop)), asyncio.create_task(enqueue())]
    try:
        yield queue, worker, acknowledged, halt
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
        await enqueuer.close()
        await queue.close()


async def started(worker: Worker, acknowledged: list[int]) -> None:
    """Wait until the worker has run and 20 enqueues were acknowledged."""
    end = time.monotonic() + 20
    while worker.runs == 0 or len(acknowledged) < 20:
        assert time.monotonic() < end, (worker.runs, len(acknowledged))
        await asyncio.sleep(0.1)


def jobs_on(port: int) -> dict[str, Any]:
    """The state of the jobs on the server at ``port`` (direct)."""
    with psycopg.connect(ReplicatedPair.url_of(port), autocommit=True) as c:
        status = dict(c.execute("SELECT status, count(*) FROM failover.jobs GROUP BY 1")
                      .fetchall())
        ids = {r[0] for r in c.execute("SELECT id FROM failover.jobs").fetchall()}
        open_jobs = c.execute(
            "SELECT id, type, status, attempts, run_after - now(), last_error, group_id "
            "FROM failover.jobs WHERE status NOT IN ('done', 'failed') ORDER BY id"
            ).fetchall()
        hooks = c.execute(
            "SELECT count(*), count(DISTINCT job_id), (SELECT count(*) FROM failover.jobs "
            "WHERE type = 'boom' AND status = 'failed') FROM failover.gave_up").fetchone()
        done_since = c.execute(
            "SELECT count(*) FROM failover.jobs WHERE status = 'done' AND "
            "finished_at > pg_postmaster_start_time()").fetchone()
    return {"status": status, "ids": ids, "hooks": hooks, "done_since": done_since,
            "open": open_jobs}


def done_after(port: int, since: float) -> int:
    """Jobs claimed (and done) on ``port`` after the instant ``since`` (epoch s)."""
    with psycopg.connect(ReplicatedPair.url_of(port), autocommit=True) as c:
        row = c.execute("SELECT count(*) FROM failover.jobs WHERE status = 'done' AND "
                        "finished_at > to_timestamp(%s)", [since]).fetchone()
    return int(row[0]) if row else 0


async def settled(port: int, seconds: float) -> dict[str, Any]:
    """Wait until no job is pending or running on ``port`` and every job that gave up
    has had its hook run (the hook runs after the failure commits, so a look between
    the two saw one hook fewer than failed jobs); its state then."""
    end = time.monotonic() + seconds
    while True:
        state = jobs_on(port)
        count, _, failed = state["hooks"]
        if (set(state["status"]) <= {"done", "failed"} and count >= failed) \
                or time.monotonic() > end:
            return state
        await asyncio.sleep(0.2)


async def test_a_crash_of_the_primary_and_a_promotion(pair: ReplicatedPair) -> None:
    async with working(pair.url) as (_, worker, acknowledged, halt):
        await started(worker, acknowledged)
        pair.stop_primary()
        await asyncio.sleep(0.5)
        pair.promote()
        promoted = time.time()
        t0 = time.monotonic()
        while done_after(pair.replica_port, promoted) == 0:
            assert time.monotonic() - t0 < 10, "no claim within 10 s of the promotion"
            await asyncio.sleep(0.1)
        resumed = time.monotonic() - t0
        before = len(acknowledged)
        await asyncio.sleep(1.0)  # more enqueues on the new primary
        assert len(acknowledged) > before
        halt.set()
        state = await settled(pair.replica_port, 20)
    assert resumed < 10
    # Synchronous replication: every enqueue acknowledged is on the new primary.
    assert set(acknowledged) <= state["ids"]
    assert set(state["status"]) <= {"done", "failed"}, state["open"]
    # Every boom job gave up once, and its hook ran exactly once.
    count, distinct, failed = state["hooks"]
    assert count == distinct == failed > 0


async def test_a_primary_turned_read_only_under_open_connections(
    pair: ReplicatedPair,
) -> None:
    async with working(pair.url) as (queue, worker, acknowledged, halt):
        await started(worker, acknowledged)
        # The old primary refuses writes on its open connections (SQLSTATE 25006) and
        # the replica takes over: the sockets stay open, as a managed failover leaves
        # them.
        with psycopg.connect(ReplicatedPair.url_of(pair.primary_port),
                             autocommit=True) as c:
            c.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            c.execute("SELECT pg_reload_conf()")
        pair.promote()
        promoted = time.time()
        t0 = time.monotonic()
        while done_after(pair.replica_port, promoted) == 0:
            assert time.monotonic() - t0 < 10, "no claim on the new primary within 10 s"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        async with queue.connection() as c:
            assert c.info.port == pair.replica_port
        halt.set()
        state = await settled(pair.replica_port, 20)
    # The old primary is still up: enqueues acknowledged before the switch were
    # replicated synchronously, later ones went to the new primary.
    assert set(acknowledged) <= state["ids"]
    assert set(state["status"]) <= {"done", "failed"}, state["open"]
    count, distinct, failed = state["hooks"]
    assert count == distinct == failed > 0
