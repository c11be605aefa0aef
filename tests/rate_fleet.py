"""One worker process of the rate-limit fleet test (tests/test_rates.py): a
:class:`rota.Worker` running a one-stage pipeline whose stage declares a shared
:class:`rota.RateLimit`, until no job of the schema is left open. Each handler start is
recorded as this machine's wall-clock time (every process of the test runs on one host,
so one clock), and printed as JSON when the worker stops.

Usage: python -m tests.rate_fleet URL SCHEMA LIMIT_PER_SECOND CONCURRENCY HANDLER_S
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import timedelta

import psycopg
from psycopg import sql

from rota import Pipeline, Queue, RateLimit, Stage, Worker
from rota.runner import JobContext


async def main(url: str, schema: str, per_second: int, concurrency: int,
               handler_s: float) -> None:
    queue = Queue(url, schema=schema, types=["call"])
    await queue.open()
    starts: list[float] = []
    grants: list[float] = []

    async def call(ctx: JobContext) -> None:
        starts.append(time.time())
        grants.append(ctx.rate_grants["api"].at.timestamp())
        await asyncio.sleep(handler_s)

    limit = RateLimit("api", per_second, timedelta(seconds=1))
    pipeline = Pipeline(queue, [Stage("call", None, concurrency, call, rate_limits=limit)],
                        platform_timeout=timedelta(seconds=60))
    stop = asyncio.Event()
    worker = Worker(pipeline, idle_poll=timedelta(seconds=0.5), maintain_every=None,
                    rescue_every=None, time_budget=timedelta(seconds=30))

    async def watch() -> None:
        query = sql.SQL("SELECT count(*) FROM {}.jobs WHERE status IN ('pending', "
                        "'running')").format(sql.Identifier(schema))
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            while True:
                row = await (await c.execute(query)).fetchone()
                if row is not None and row[0] == 0:
                    stop.set()
                    return
                await asyncio.sleep(0.2)

    watcher = asyncio.create_task(watch())
    await worker.run_forever(stop)
    await watcher
    await queue.close()
    print(json.dumps({"starts": starts, "grants": grants, "runs": worker.runs}))


if __name__ == "__main__":
    u, s, n, c, h = sys.argv[1:6]
    asyncio.run(main(u, s, int(n), int(c), float(h)))
