"""rota through PgBouncer in transaction mode against a direct connection
(docs/operations.md, "Poolers and failover"):

- enqueue to start: an idle ``Worker`` (the README's one-stage pipeline) and an enqueuer
  in this process; ``N`` jobs enqueued one at a time, ``SPACING`` apart; the latency is
  from ``enqueue`` returning (committed) to the handler starting, p50 and p95, the first
  ``WARMUP`` not counted. Three ways: direct, through the pooler without ``listen_url``
  (notifications do not pass it: the worker polls every ``fallback_poll``, 1 s), and
  through the pooler with ``listen_url`` (the LISTEN connection direct).
- drain: ``DRAIN`` jobs over 100 groups enqueued, then a worker (batch 50, 10 handlers,
  no-op handler) drains them; jobs/s, direct and through the pooler.

Each measure takes turns over ``--rounds`` rounds (medians reported), each in a fresh
schema of ``DATABASE_URL``'s database, dropped afterwards; PgBouncer (Debian's package)
is started on a free loopback port by ``tests/pgbouncer.py`` and stopped at the end.

Usage, from the repository's root (about a minute)::

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/test .venv/bin/python -m bench.poolers
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

N = 60
SPACING = 0.1  # seconds between two enqueues
WARMUP = 3
DRAIN = 3000


async def _drop(url: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(schema)))


async def enqueue_to_start(url: str, direct: str, listen_url: str | None) -> list[float]:
    """Seconds from each enqueue's commit to its handler's start."""
    from rota import Pipeline, Queue, Stage, Worker

    schema = f"bench_pool_{uuid.uuid4().hex[:8]}"
    started: dict[int, float] = {}
    stop, every_one = asyncio.Event(), asyncio.Event()

    async def h(ctx: Any) -> None:
        started[int(ctx.job.payload["i"])] = time.perf_counter()
        if len(started) == N:
            every_one.set()

    try:
        async with Queue(url, schema=schema, listen_url=listen_url) as queue:
            await queue.migrate()
            worker = Worker(Pipeline(queue, [Stage("t", handler=h)]), maintain_every=None)
            task = asyncio.create_task(worker.run_forever(stop))
            while worker.notifications is None:  # noqa: ASYNC110 (the worker's own check)
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            sent: dict[int, float] = {}
            async with Queue(url, schema=schema) as enqueuer:
                for i in range(N):
                    await enqueuer.enqueue("t", {"i": i})
                    sent[i] = time.perf_counter()
                    await asyncio.sleep(SPACING)
                await asyncio.wait_for(every_one.wait(), 5)
            stop.set()
            await task
    finally:
        await _drop(direct, schema)
    return [started[i] - sent[i] for i in range(WARMUP, N)]


async def drain(url: str, direct: str) -> float:
    """Jobs per second a worker drains ``DRAIN`` no-op jobs at."""
    from rota import Pipeline, Queue, Stage, Worker

    schema = f"bench_pool_{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    done = 0

    async def noop(ctx: Any) -> None:
        nonlocal done
        done += 1
        if done >= DRAIN:
            stop.set()

    try:
        async with Queue(url, schema=schema) as queue:
            await queue.migrate()
            groups = [f"g{i}" for i in range(100)]
            for g in groups:
                await queue.upsert_group(g, plan="free")
            await queue.enqueue_many([{"type": "noop", "payload": {}, "group_id": groups[i % 100]}
                                      for i in range(DRAIN)])
            worker = Worker(Pipeline(queue, [Stage("noop", 50, 10, noop)]),
                            maintain_every=None, idle_poll=timedelta(seconds=1))
            t = time.perf_counter()
            await worker.run_forever(stop)
            return DRAIN / (time.perf_counter() - t)
    finally:
        await _drop(direct, schema)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main(direct: str, rounds: int) -> None:
    from tests.pgbouncer import PgBouncer

    with PgBouncer(direct, pool_mode="transaction") as bouncer:
        pooled = bouncer.url()
        ways = {"direct": (direct, None), "pooler": (pooled, None),
                "pooler + listen_url": (pooled, direct)}
        latency: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
        rate: dict[str, list[float]] = {"direct": [], "pooler": []}
        for _ in range(rounds):
            for way, (url, listen) in ways.items():
                xs = await enqueue_to_start(url, direct, listen)
                latency[way].append((_pct(xs, 0.5), _pct(xs, 0.95)))
            for way in rate:
                rate[way].append(await drain(ways[way][0], direct))
    base = statistics.median(p50 for p50, _ in latency["direct"])
    print(f"enqueue to start ({N - WARMUP} jobs {SPACING:g} s apart, medians of {rounds} "
          "rounds)")
    print(f"{'way':<22}{'p50 ms':>9}{'p95 ms':>9}{'p50 / direct':>14}")
    for way, xs in latency.items():
        p50 = statistics.median(p for p, _ in xs)
        p95 = statistics.median(p for _, p in xs)
        print(f"{way:<22}{p50 * 1000:>9.1f}{p95 * 1000:>9.1f}{p50 / base:>14.2f}")
    print(f"\ndrain ({DRAIN} no-op jobs, batch 50, 10 handlers, medians of {rounds} rounds)")
    direct_rate = statistics.median(rate["direct"])
    for way, xs in rate.items():
        r = statistics.median(xs)
        print(f"{way:<22}{r:>9.0f} jobs/s{r / direct_rate:>8.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("error: set DATABASE_URL to a server PgBouncer can reach on TCP")
    asyncio.run(main(url, args.rounds))
