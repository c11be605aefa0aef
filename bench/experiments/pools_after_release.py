"""Experiment, not shipped: which group pool the claim should walk once a long
transaction has released the xmin horizon, while ``fair_groups`` is still as large as the
pin made it (bench/RESULTS.md, section 19). Builds bench/pinned.py's data, churns as its
worker loop does (claim 100, complete, enqueue 100), then times the claim of 25 with
each pool, the index walk (``claim_pool_cached.sql``) and the sorted pass
(``claim_pool_sorted.sql``), as the generic plans the claim runs (PREPARE, EXPLAIN
EXECUTE under ``claim_settings.sql``, rolled back), interleaved, with no churn running
while it times them: on the compact table, while a REPEATABLE READ transaction pins the
horizon, and after it ends and ``fair_groups`` is vacuumed (its pages stay), at several
probe sizes. Prints medians of the execution time and of the buffers read.

Usage: ``python -m bench.experiments.pools_after_release [seconds [rounds]]`` (default
a 60 s pin, 15 rounds; 100,000 pending over 2,000 groups).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

from ..pinned import _replacements
from ..scale import build

SCHEMA = "bench_pools_after_release"
PROBES = (58, 208, 556)  # the floor of a claim of 25, and the sizes seen flat out


async def prepare(queue: Queue, conn: psycopg.AsyncConnection[Any], sorted_pass: bool
                  ) -> tuple[str, Any, list[str], dict[str, Any]]:
    """PREPARE one pool's claim of 25 on ``conn``; returns its name, statement,
    parameter types and parameters (probe_groups is set per run)."""
    held = queue.upkeep.horizon_held
    queue.upkeep.horizon_held = sorted_pass
    try:
        statement = queue.fair_claim.statement()
    finally:
        queue.upkeep.horizon_held = held
    params = {"type": "t", "limit": 25, "run_id": None, "offset": queue.clock_offset,
              "stale_after": queue.stale_after, "served_window": queue.served_window,
              **queue.plans.claim_params(), "probe_groups": PROBES[0], "probe_per": 2,
              "probe_spread": 2, "candidates": 116}
    # The parameters' types as psycopg sends them (pinned_explain.explain does the same).
    async with await psycopg.AsyncConnection.connect(str(queue.pool.conninfo)) as c:
        await c.execute(queue.store.sql("fair/claim_settings"))
        await psycopg.AsyncRawCursor(c).execute(statement.text, statement.params(params),
                                                prepare=True)
        cur = await c.execute("SELECT parameter_types::text[] FROM pg_prepared_statements "
                              "WHERE NOT from_sql")
        types = (await cur.fetchall())[-1][0]
        await c.rollback()
    name = "sorted_pass" if sorted_pass else "index_walk"
    await conn.execute(sql.SQL("PREPARE {} ({}) AS ").format(
        sql.Identifier(name), sql.SQL(", ").join(map(sql.SQL, types)))
        + sql.SQL(statement.text.replace("%", "%%")))
    return name, statement, types, params


async def time_pools(queue: Queue, conn: psycopg.AsyncConnection[Any], prepared: list[Any],
                     probe: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median execution time (ms) and buffers of each prepared pool, interleaved."""
    seen: dict[str, list[tuple[float, int]]] = {}
    for i in range(rounds):
        for name, statement, types, params in prepared if i % 2 == 0 else prepared[::-1]:
            values = statement.params({**params, "probe_groups": probe})
            args = sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(t))
                                      for v, t in zip(values, types, strict=True))
            await conn.execute("BEGIN")
            await conn.execute(queue.store.sql("fair/claim_settings"))
            cur = await conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                             "EXECUTE {} ({})").format(sql.Identifier(name),
                                                                       args))
            plan = (await cur.fetchone() or [None])[0]
            await conn.execute("ROLLBACK")
            root = plan[0]["Plan"]
            seen.setdefault(name, []).append(
                (plan[0]["Execution Time"],
                 root["Shared Hit Blocks"] + root.get("Shared Read Blocks", 0)))
    return {k: (statistics.median(t for t, _ in v), statistics.median(b for _, b in v))
            for k, v in seen.items()}


async def main(url: str, seconds: float, rounds: int) -> None:
    await build(url, SCHEMA, pending=100_000, groups=2_000, done=20_000)
    rng = random.Random(11)
    ident = sql.Identifier(SCHEMA)
    async with (Queue(url, schema=SCHEMA) as queue,
                await psycopg.AsyncConnection.connect(url, autocommit=True,
                                                      prepare_threshold=None) as conn,
                await psycopg.AsyncConnection.connect(url) as holder):
        async def churn(until: float) -> None:
            while time.monotonic() < until:
                jobs = await queue.claim("t", 100)
                if jobs:
                    await queue.complete_many(jobs)
                await queue.enqueue_many(_replacements(len(jobs) or 100, 2_000, rng))

        async def size() -> str:
            cur = await conn.execute(
                "SELECT pg_relation_size(%s::regclass) / 8192, n_dead_tup "
                "FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'fair_groups'",
                [f"{SCHEMA}.fair_groups", SCHEMA])
            pages, dead = await cur.fetchone() or (0, 0)
            return f"fair_groups {pages} pages, {dead} dead versions"

        async def report(label: str, probes: tuple[int, ...] = PROBES) -> None:
            print(f"== {label} ({await size()})", flush=True)
            for probe in probes:
                got = await time_pools(queue, conn, prepared, probe, rounds)
                print(f"   probe {probe}: " + ", ".join(
                    f"{k} {ms:.2f} ms {b:.0f} buffers" for k, (ms, b) in got.items()),
                    flush=True)

        await churn(time.monotonic() + 10)
        await queue.upkeep.run_once()
        await conn.execute(sql.SQL("VACUUM {}.fair_groups").format(ident))
        prepared = [await prepare(queue, conn, False), await prepare(queue, conn, True)]
        await report("compact")
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}.groups").format(ident))
        await churn(time.monotonic() + seconds)
        await queue.upkeep.run_once()
        await report(f"pinned {seconds:.0f} s", PROBES[:1])
        await holder.rollback()
        await conn.execute(sql.SQL("VACUUM {}.fair_groups").format(ident))
        await report("released, vacuumed")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))


if __name__ == "__main__":
    asyncio.run(main(os.environ.get("DATABASE_URL",
                                    "postgresql://postgres@127.0.0.1:5432/test"),
                     float(sys.argv[1]) if len(sys.argv) > 1 else 60.0,
                     int(sys.argv[2]) if len(sys.argv) > 2 else 15))
