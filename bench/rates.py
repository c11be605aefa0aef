"""The rate limiter's cost per take (part of ``make bench``; alone: ``python -m
bench.rates [--seconds S] [--processes N]``).

N processes (default 8) each take one unit at a time, back to back, on their own
connection, for S seconds (default 3): ``rate_take`` through :meth:`rota.RateLimit.take`
(the named statement, the schema's function, a commit each), with a limit far above
what they reach, so every take is granted and the figure is the cost of the take, not
the limit. Three configurations, in the same run:

- **one key**: every take on one bucket row, so each waits for the row lock of the one
  before (the worst case: an unkeyed limit shared by the whole fleet);
- **100 keys**: each take on one of 100 buckets at random (a keyed limit);
- **quota spend, one key** (the reference): :meth:`rota.Quota.spend`, the quota's one
  atomic upsert on one usage row, with the default synchronous commit.

The processes start, connect, and are released together. Reported: takes per second
(all processes) and the median take's latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import statistics
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue, Quota, RateLimit

CONFIGS = ("one key", "100 keys", "quota spend, one key (reference)")


def _worker(url: str, schema: str, config: str, seconds: float, start_at: float,
            out: Any) -> None:
    async def go() -> tuple[int, list[float]]:
        queue = Queue(url, schema=schema)
        await queue.open()
        limit = RateLimit("bench", 1_000_000, timedelta(seconds=1), burst=1_000_000)
        quota = Quota("bench", 2**62)
        keys = [f"k{i}" for i in range(100)]
        await asyncio.sleep(max(start_at - time.time(), 0.0))
        end = time.time() + seconds
        n, lat = 0, []
        while time.time() < end:
            t0 = time.perf_counter()
            if config == "one key":
                await limit.take(queue, 1)
            elif config == "100 keys":
                await limit.take(queue, 1, key=random.choice(keys))
            else:
                await quota.spend(queue, 1)
            lat.append(time.perf_counter() - t0)
            n += 1
        await queue.close()
        return n, lat

    try:
        n, lat = asyncio.run(go())
    except BaseException as exc:
        out.put(exc)
        raise
    out.put((n, statistics.median(lat) if lat else 0.0))


def measure(url: str, config: str, processes: int, seconds: float) -> dict[str, float]:
    schema = f"bench_rates_{uuid.uuid4().hex[:8]}"

    async def setup() -> None:
        async with Queue(url, schema=schema) as q:
            await q.migrate()

    asyncio.run(setup())
    try:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        start_at = time.time() + 2.0  # every process connected before the window opens
        procs = [ctx.Process(target=_worker, args=(url, schema, config, seconds, start_at,
                                                   out)) for _ in range(processes)]
        for p in procs:
            p.start()
        results = [out.get(timeout=seconds + 60) for _ in procs]
        for r in results:
            if isinstance(r, BaseException):
                raise r
        for p in procs:
            p.join()
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    total = sum(n for n, _ in results)
    return {"takes_per_s": total / seconds,
            "median_ms": statistics.median(m for _, m in results) * 1000}


def report(result: dict[str, dict[str, float]]) -> str:
    """A markdown table, with each figure's ratio to the reference."""
    ref = result[CONFIGS[-1]]["takes_per_s"]
    lines = ["| configuration | takes/s (all processes) | median take (ms) | vs reference |",
             "|---|---:|---:|---:|"]
    for name, r in result.items():
        lines.append(f"| {name} | {r['takes_per_s']:,.0f} | {r['median_ms']:.2f} | "
                     f"{r['takes_per_s'] / ref:.2f}x |")
    return "\n".join(lines)


def main(url: str, processes: int = 8, seconds: float = 3.0) -> dict[str, Any]:
    result = {c: measure(url, c, processes, seconds) for c in CONFIGS}
    print(report(result))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    print(json.dumps(main(url, args.processes, args.seconds), indent=2))
