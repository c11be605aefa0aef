"""What `rota verify` (and `rota verify --repair`) costs at scale: 1,000,000 jobs (800,000
pending, 200,000 done inside the served window) over 10,000 groups, built with
bench.scale. Prints the median of 3 verifies and one rebuild, with the machine's load.
``python -m bench.verify_cost`` (DATABASE_URL chooses the server; a few minutes)."""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import psycopg
from psycopg import sql

from rota import Queue

from .scale import build

SCHEMA = "bench_verify"


async def main() -> None:
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    started = time.monotonic()
    await build(url, SCHEMA, pending=800_000, done=200_000, groups=10_000)
    print(f"built in {time.monotonic() - started:.0f} s; load {os.getloadavg()}")
    async with Queue(url, schema=SCHEMA) as queue:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            violations = await queue.verify()
            times.append(time.perf_counter() - t)
            assert violations == [], violations[:5]
        print(f"verify: median {statistics.median(times):.2f} s of {times}; "
              f"load {os.getloadavg()}")
        t = time.perf_counter()
        report = await queue.repair_bookkeeping()
        print(f"repair: {time.perf_counter() - t:.2f} s, {report.groups} group rows, "
              f"{len(report.found)} violations before; load {os.getloadavg()}")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(SCHEMA)))


if __name__ == "__main__":
    asyncio.run(main())
