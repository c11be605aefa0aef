"""Experiment, not shipped: the fair claim after a fixed amount of churn under a long
transaction (bench/RESULTS.md, section 30), so that two versions of rota are compared
on the same work rather than over the same time (a faster version churns more in a
timed pin, and leaves more dead row versions behind).

Builds 100,000 pending jobs over 2,000 groups (``bench/scale.py``), churns 20 cycles
(claim 100, complete them, enqueue 100), then opens the long transaction on another
connection (REPEATABLE READ, a read: it holds a snapshot), and runs ``cycles`` more,
then 60 claims of 25 (each completed and replaced), timed. Prints the churn's rate, the
claims' p50, and the index entries of ``fair_served_xid_idx`` one more claim is
returned (``pg_stat_get_xact_tuples_returned``: dead ones included).

Usage: ``python -m bench.experiments.open_writer MODE [cycles]`` (default 300), MODE:
``snap`` (the transaction only reads), ``xid`` (it also takes an xid, as one that wrote
and stays open), ``xidgroup`` (it also enqueues a job into group g0, so it holds that
group's fair_groups row). DATABASE_URL, default the local test database; the schema
``bench_open_writer`` is dropped after.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

import psycopg
from psycopg import sql

from rota import Queue

from ..scale import build

SCHEMA = "bench_open_writer"
MODES = ("snap", "xid", "xidgroup")


async def run(url: str, mode: str, cycles: int) -> None:
    await build(url, SCHEMA, pending=100_000, groups=2_000, done=20_000)
    queue = Queue(url, schema=SCHEMA)
    await queue.open()
    holder = await psycopg.AsyncConnection.connect(url)
    seq = 0

    async def cycle(n: int) -> float:
        nonlocal seq
        t = time.perf_counter()
        jobs = await queue.claim("t", n)
        took = time.perf_counter() - t
        await queue.complete_many(jobs)
        seq += len(jobs)
        await queue.enqueue_many([{"type": "t", "payload": {},
                                   "group_id": f"g{(seq * 7919 + k) % 2000}"}
                                  for k in range(len(jobs))])
        return took * 1000

    try:
        for _ in range(20):
            await cycle(100)
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}.groups")
                             .format(sql.Identifier(SCHEMA)))
        if mode == "xid":
            await holder.execute("SELECT pg_current_xact_id()")
        elif mode == "xidgroup":
            await queue.enqueue("t", {}, group_id="g0", conn=holder)
        t0 = time.perf_counter()
        for _ in range(cycles):
            await cycle(100)
        churn = time.perf_counter() - t0
        p50 = statistics.median([await cycle(25) for _ in range(60)])
        async with await psycopg.AsyncConnection.connect(url) as c:
            await queue.claim("t", 25, conn=c)
            cur = await c.execute("SELECT pg_stat_get_xact_tuples_returned(%s::regclass)",
                                  [f"{SCHEMA}.fair_served_xid_idx"])
            row = await cur.fetchone()
            await c.rollback()
        entries = row[0] if row else None
        print(f"{mode} {cycles} cycles: churn {cycles * 100 / churn:,.0f} jobs/s, claim of 25"
              f" p50 {p50:.2f} ms, fair_served_xid_idx entries a claim {entries}",
              flush=True)
    finally:
        await holder.rollback()
        await holder.close()
        await queue.close()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
                            .format(sql.Identifier(SCHEMA)))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in MODES:
        sys.exit(f"usage: python -m bench.experiments.open_writer {{{'|'.join(MODES)}}}"
                 " [cycles]")
    asyncio.run(run(os.environ.get("DATABASE_URL",
                                   "postgresql://postgres@127.0.0.1:5432/test"),
                    sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 300))
