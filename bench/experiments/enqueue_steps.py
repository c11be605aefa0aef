"""Experiment, not shipped: the client CPU of each step of rota's Python path around a
single enqueue's statement (bench/RESULTS.md, section 17), ``time.process_time`` per
call over 5,000 calls. Needs the database bench/experiments/enqueue_profile.py leaves
behind (``bench_enqueue_profile_rota``).

Usage: ``python -m bench.experiments.enqueue_steps``.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import psycopg
from psycopg.rows import dict_row

from rota import Queue
from rota.enqueue import enqueue_params, enqueued_job


async def main(url: str, n: int = 5000) -> None:
    queue = Queue(psycopg.conninfo.make_conninfo(url, dbname="bench_enqueue_profile_rota"),
                  schema="rota_enqueue")
    await queue.open()
    params = enqueue_params(queue.settings, "noop", {}, group_id="g1")
    row = await queue.store.fetch_dict("enqueue", {**params, "trace_context": None})

    async def pool_checkout() -> None:
        async with queue.pool.connection():
            pass

    async def store_deadline_and_checkout() -> None:
        async with queue.store.deadline(), queue.store.connection():
            pass

    async def checkout_and_cursor() -> None:
        async with queue.pool.connection() as c:
            queue.store.cursor(c, dict_row)

    async def parameters() -> None:
        enqueue_params(queue.settings, "noop", {}, group_id="g1")

    async def tracer() -> None:
        with queue.tracer.enqueue("noop", 1):
            pass

    async def job() -> None:
        enqueued_job(row)

    steps: dict[str, Callable[[], Awaitable[None]]] = {
        "pool checkout": pool_checkout, "deadline and checkout": store_deadline_and_checkout,
        "checkout and cursor set-up": checkout_and_cursor, "parameters": parameters,
        "tracer": tracer, "the Job from the row": job}
    try:
        for name, step in steps.items():
            t = time.process_time()
            for _ in range(n):
                await step()
            print(f"{name}: {(time.process_time() - t) / n * 1e6:.1f} µs")
    finally:
        await queue.close()


if __name__ == "__main__":
    asyncio.run(main(os.environ.get("DATABASE_URL",
                                    "postgresql://postgres@127.0.0.1:5432/test")))
