"""rota through PgBouncer in transaction mode against a direct connection
(docs/operations.md, "Poolers and failover"):

- enqueue to start: an idle ``Worker`` (the README's one-stage pipeline) and an enqueuer
  in this process; ``N`` jobs enqueued one at a time, ``SPACING`` apart; the latency is
  from ``enqueue`` returning (committed) to the handler starting, p50 and p95, the first
  ``WARMUP`` not counted. Three ways: direct, through the pooler without ``listen_url``
  (notifications do not pass it: the worker polls every ``fallback_poll``, 1 s), and
  through the pooler with ``listen_url`` (the LISTEN connection direct); and, to tell
  the pooler's hop from what rota does differently behind one, direct with
  ``pooled=True`` (no startup options, settings per transaction, nothing prepared).
- drain: ``DRAIN`` jobs over 100 groups enqueued, then a worker (batch 50, 10 handlers,
  no-op handler) drains them; jobs/s, direct and through the pooler.

- claim (``--claims``): 100 claims of one job each, after 10 to warm up, direct with
  ``pooled=False`` (prepared) and ``pooled=True`` (planned at every call), alternating
  over the rounds: the median milliseconds a claim.

Each measure takes turns over ``--rounds`` rounds (the ways in a rotated order each
round, so none is always first after the drain or last before it), each in a fresh
schema of ``DATABASE_URL``'s database, dropped afterwards; each round's p50s and the
machine's load average are printed as they come, then the medians over rounds and the
p50 of every sample pooled. PgBouncer (Debian's package) is started on a free loopback
port by ``tests/pgbouncer.py`` and stopped at the end.

Usage, from the repository's root (about a minute; ``--rounds 7 --no-drain``, about
four)::

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


async def enqueue_to_start(url: str, direct: str, listen_url: str | None,
                           pooled: bool | None = None) -> list[float]:
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
        async with Queue(url, schema=schema, listen_url=listen_url, pooled=pooled) as queue:
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


async def claim_ms(direct: str, pooled: bool) -> float:
    """The median milliseconds of a claim of one job (100, after 10 to warm up)."""
    from rota import Queue

    schema = f"bench_pool_{uuid.uuid4().hex[:8]}"
    try:
        async with Queue(direct, schema=schema, pooled=pooled) as queue:
            await queue.migrate()
            await queue.enqueue_many([{"type": "t", "payload": {}} for _ in range(120)])
            times = []
            for i in range(110):
                t = time.perf_counter()
                await queue.claim("t", 1)
                if i >= 10:
                    times.append(time.perf_counter() - t)
            return statistics.median(times) * 1000
    finally:
        await _drop(direct, schema)


async def claims(direct: str, rounds: int) -> None:
    """Print the claim's cost prepared and planned at every call, round by round."""
    ms: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for pooled in ms:
            ms[pooled].append(await claim_ms(direct, pooled))
    print(f"claim of one job, direct, median ms of 100 a round ({rounds} rounds, "
          f"load {os.getloadavg()[0]:.1f})")
    for pooled, xs in ms.items():
        print(f"pooled={pooled!s:<6}" + "".join(f"{x:>7.1f}" for x in xs))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main(direct: str, rounds: int, drains: bool) -> None:
    from tests.pgbouncer import PgBouncer

    with PgBouncer(direct, pool_mode="transaction") as bouncer:
        pooled = bouncer.url()
        ways: dict[str, tuple[str, str | None, bool | None]] = {
            "direct": (direct, None, None),
            "direct, pooled=True": (direct, None, True),
            "pooler": (pooled, None, None),
            "pooler + listen_url": (pooled, direct, None),
        }
        names = list(ways)
        latency: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
        samples: dict[str, list[float]] = {w: [] for w in ways}
        rate: dict[str, list[float]] = {"direct": [], "pooler": []}
        for n in range(rounds):
            order = names[n % len(names):] + names[:n % len(names)]
            load = os.getloadavg()[0]
            for way in order:
                url, listen, is_pooled = ways[way]
                xs = await enqueue_to_start(url, direct, listen, is_pooled)
                latency[way].append((_pct(xs, 0.5), _pct(xs, 0.95)))
                samples[way] += xs
            p50s = {way: latency[way][-1][0] for way in names}
            print(f"round {n + 1}: load {load:.1f}-{os.getloadavg()[0]:.1f}; p50 ms "
                  + ", ".join(f"{way} {p * 1000:.1f}" for way, p in p50s.items())
                  + f"; listen_url / direct {p50s['pooler + listen_url'] / p50s['direct']:.2f}",
                  flush=True)
            if drains:
                for way in rate:
                    rate[way].append(await drain(ways[way][0], direct))
    base = statistics.median(p50 for p50, _ in latency["direct"])
    base_all = statistics.median(samples["direct"])
    print(f"\nenqueue to start ({N - WARMUP} jobs {SPACING:g} s apart a round, medians of "
          f"{rounds} rounds; and the p50 of all {rounds * (N - WARMUP)} samples)")
    print(f"{'way':<22}{'p50 ms':>9}{'p95 ms':>9}{'p50 / direct':>14}{'all p50':>9}"
          f"{'/ direct':>9}")
    for way, xs in latency.items():
        p50 = statistics.median(p for p, _ in xs)
        p95 = statistics.median(p for _, p in xs)
        whole = statistics.median(samples[way])
        print(f"{way:<22}{p50 * 1000:>9.1f}{p95 * 1000:>9.1f}{p50 / base:>14.2f}"
              f"{whole * 1000:>9.1f}{whole / base_all:>9.2f}")
    if not drains:
        return
    print(f"\ndrain ({DRAIN} no-op jobs, batch 50, 10 handlers, medians of {rounds} rounds)")
    direct_rate = statistics.median(rate["direct"])
    for way, xs in rate.items():
        r = statistics.median(xs)
        print(f"{way:<22}{r:>9.0f} jobs/s{r / direct_rate:>8.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-drain", action="store_true",
                        help="enqueue to start only (the drain takes most of a round)")
    parser.add_argument("--claims", action="store_true",
                        help="only the claim's cost, prepared and planned each call")
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("error: set DATABASE_URL to a server PgBouncer can reach on TCP")
    if args.claims:
        asyncio.run(claims(url, args.rounds))
    else:
        asyncio.run(main(url, args.rounds, not args.no_drain))
