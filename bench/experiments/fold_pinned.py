"""Experiment, not shipped: what one fold of the claim's upkeep costs while a long
transaction holds the xmin horizon and the queue churns flat out (docs/fast-claim.md,
"What a fold reads"; bench/RESULTS.md, section 25).

bench/scale.py's data (``pending`` ready jobs over ``groups`` groups in three plans); a
REPEATABLE READ transaction takes a snapshot and holds it; then, for ``seconds``, a loop
claims 100 (``Queue.claim``, the queue's own upkeep off), completes them, enqueues 100
into random groups and runs one fold (``fair_fold``) on a connection of its own, timed.
Every 200 rounds it prints the p50 of the last 200 folds and of the last 200 claims of
100. ``--fold FILE``: first replace the schema's ``fair_fold`` with the function in FILE
(``{schema}`` replaced), to compare another version of it on the same data (say the one
``git show REV:src/rota/fair/bookkeeping.sql`` holds, its ``CREATE FUNCTION
{schema}.fair_fold`` statement made ``CREATE OR REPLACE``).

Usage: ``python -m bench.experiments.fold_pinned [seconds [pending groups]]
[--fold FILE]`` (default 60 s, 100,000 pending over 2,000 groups; DATABASE_URL, default
the local test server).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import time
from pathlib import Path

import psycopg
from psycopg import sql

from rota import Queue

from ..scale import build

SCHEMA = "bench_fold_pinned"


async def main(url: str, seconds: float, pending: int, groups: int,
               fold: str | None) -> None:
    """``fold``: the text of another fair_fold to run instead (None: the schema's)."""
    await build(url, SCHEMA, pending=pending, groups=groups, done=pending // 5)
    s = sql.Identifier(SCHEMA)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        if fold:
            await c.execute(fold.replace("{schema}", s.as_string(c)).encode())
    queue = Queue(url, schema=SCHEMA)
    await queue.open()
    # The test's folds only: the queue's own upkeep never runs one.
    queue.upkeep.config = dataclasses.replace(queue.upkeep.config, every=1e9)
    pin = await psycopg.AsyncConnection.connect(url)
    folds: list[float] = []
    claims: list[float] = []
    try:
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await pin.execute(sql.SQL("SELECT count(*) FROM {}.fair_fold_lock").format(s))
        start = time.perf_counter()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            while time.perf_counter() - start < seconds:
                t = time.perf_counter()
                jobs = await queue.claim("t", 100)
                claims.append((time.perf_counter() - t) * 1000)
                await queue.complete_many(jobs)
                await queue.enqueue_many([
                    {"type": "t", "payload": {}, "group_id": f"g{random.randrange(groups)}"}
                    for _ in range(100)])
                t = time.perf_counter()
                await c.execute(sql.SQL("SELECT {}.fair_fold('t', now())").format(s))
                folds.append((time.perf_counter() - t) * 1000)
                if len(folds) % 200 == 0:
                    print(f"{time.perf_counter() - start:5.0f} s pinned, {len(folds):5} "
                          f"rounds: fold p50 {statistics.median(folds[-200:]):6.2f} ms, "
                          f"claim of 100 p50 {statistics.median(claims[-200:]):6.2f} ms",
                          flush=True)
        await pin.rollback()
        print(f"rota verify: {len(await queue.verify())} violations")
    finally:
        await pin.close()
        await queue.close()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.experiments.fold_pinned")
    p.add_argument("seconds", nargs="?", type=float, default=60.0)
    p.add_argument("pending", nargs="?", type=int, default=100_000)
    p.add_argument("groups", nargs="?", type=int, default=2_000)
    p.add_argument("--fold", help="a file holding another fair_fold to compare")
    a = p.parse_args()
    asyncio.run(main(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
                     a.seconds, a.pending, a.groups,
                     Path(a.fold).read_text() if a.fold else None))
