"""Experiment, not shipped: the owner claim (``fair_by="owner"``) under a held horizon
that took an xid (bench/RESULTS.md, section 31). Builds 1,000,000 pending jobs over
10,000 groups and 1,000 owners (``bench/scale.py``), churns as ``bench/pinned.py``'s
worker loop does (claim 100, complete, enqueue 100) for 15 s, then for ``seconds`` with
a REPEATABLE READ transaction that took an xid open, and before and after the pin times
30 claims of 25, each on a new connection and rolled back (so each p50 includes
planning the statement), and counts the entries of ``fair_owners_walk_idx`` a claim
returns. Prints both, and ``rota verify``'s count after the release.

Usage: ``python -m bench.experiments.owner_pin [seconds]`` (default 30; DATABASE_URL,
default the local test database).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time

import psycopg
from psycopg import sql

from rota import Queue

from ..pinned import _replacements
from ..scale import build

SCHEMA = "bench_owner_pin"


async def timed(queue: Queue, url: str, n: int = 30) -> tuple[float, float]:
    """p50 of ``n`` claims of 25 (ms) and of the owner walk's index entries each read."""
    times, entries = [], []
    for _ in range(n):
        async with await psycopg.AsyncConnection.connect(url) as c:
            t = time.perf_counter()
            await queue.claim("t", 25, conn=c)
            times.append((time.perf_counter() - t) * 1000)
            cur = await c.execute("SELECT pg_stat_get_xact_tuples_returned(%s::regclass)",
                                  [f"{SCHEMA}.fair_owners_walk_idx"])
            row = await cur.fetchone()
            assert row is not None
            entries.append(row[0])
            await c.rollback()
    return statistics.median(times), statistics.median(entries)


async def main(url: str, seconds: float) -> None:
    await build(url, SCHEMA, pending=1_000_000, groups=10_000, done=200_000, owners=1_000)
    rng = random.Random(5)
    async with (Queue(url, schema=SCHEMA, fair_by="owner") as queue,
                await psycopg.AsyncConnection.connect(url) as holder):
        async def churn(until: float) -> None:
            while time.monotonic() < until:
                jobs = await queue.claim("t", 100)
                if jobs:
                    await queue.complete_many(jobs)
                await queue.enqueue_many(_replacements(len(jobs) or 100, 10_000, rng))

        await churn(time.monotonic() + 15)
        p50, n = await timed(queue, url)
        print(f"before the pin: p50 {p50:.2f} ms, owner-walk entries {n:.0f}")
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await holder.execute("SELECT pg_current_xact_id()")
        await churn(time.monotonic() + seconds)
        p50, n = await timed(queue, url)
        print(f"after {seconds:.0f} s pinned: p50 {p50:.2f} ms, owner-walk entries {n:.0f}")
        await holder.rollback()
        print("rota verify after the release:", len(await queue.verify()), "violations")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(SCHEMA)))


if __name__ == "__main__":
    asyncio.run(main(os.environ.get("DATABASE_URL",
                                    "postgresql://postgres@127.0.0.1:5432/test"),
                     float(sys.argv[1]) if len(sys.argv) > 1 else 30.0))
