"""Experiment, not shipped: where a single enqueue's time goes (bench/RESULTS.md, section
17). Each variant enqueues one job per call, autocommit, ``n`` calls a round; rounds
interleave the variants (A B C … A B C …) and each figure is the median over rounds of
the round's mean wall time per call, with the client's CPU time per call beside it
(``time.process_time``: the Python side, psycopg or asyncpg included).

Variants:
- ``rota``: ``Queue.enqueue("noop", {}, group_id=g)``, the whole path.
- ``rota statement, raw``: the same ``enqueue.sql`` text and parameters
  (``rota.enqueue.enqueue_params``) on one plain psycopg connection, prepared: the
  database's share plus psycopg's.
- ``insert, triggers``: a plain ``INSERT INTO jobs … RETURNING *`` of the same job (no
  ``enqueue_jobs``): what the function's checks cost, by difference.
- ``insert, no fair trigger``: the same with ``jobs_fair_insert`` disabled in this
  scratch database: what the bookkeeping trigger costs, by difference.
- ``select 1``: a round trip with no write and no commit.
- ``pgqueuer (asyncpg)``, ``pgqueuer (psycopg)``: ``Queries.enqueue("noop", b"x")``.

Usage: ``python -m bench.experiments.enqueue_profile [rounds [n]]`` (default 7 rounds of
500 calls).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import psycopg

from rota import Queue
from rota.enqueue import enqueue_params

from ..enqueue import database, pgqueuer_connect

Call = Callable[[int], Awaitable[None]]


async def variants(url: str) -> tuple[dict[str, Call], list[Callable[[], Awaitable[None]]]]:
    rota_url = database(url, "bench_enqueue_profile_rota")
    queue = Queue(rota_url, schema="rota_enqueue")
    await queue.open()
    await queue.migrate()
    groups = [f"g{i}" for i in range(100)]
    for g in groups:
        await queue.upsert_group(g, plan="free")
    raw = await psycopg.AsyncConnection.connect(rota_url, autocommit=True)
    plain = await psycopg.AsyncConnection.connect(rota_url, autocommit=True)
    statement = queue.store.sql("enqueue")
    insert = ("INSERT INTO rota_enqueue.jobs (type, group_id, payload, max_attempts, "
              "run_after, created_at) VALUES (%s, %s, %s::jsonb, 3, now(), now()) "
              "RETURNING *")
    # A second table shaped like jobs, without the fair trigger, so the first keeps it.
    await plain.execute("CREATE TABLE rota_enqueue.jobs_nofair (LIKE rota_enqueue.jobs "
                        "INCLUDING ALL)")
    await plain.execute("CREATE TRIGGER jobs_notify_inserted AFTER INSERT ON "
                        "rota_enqueue.jobs_nofair REFERENCING NEW TABLE AS inserted FOR "
                        "EACH STATEMENT EXECUTE FUNCTION "
                        "rota_enqueue.notify_jobs_inserted()")
    nofair = insert.replace("rota_enqueue.jobs ", "rota_enqueue.jobs_nofair ")

    async def rota(i: int) -> None:
        await queue.enqueue("noop", {}, group_id=groups[i % 100])

    async def rota_raw(i: int) -> None:
        params = enqueue_params(queue.settings, "noop", {}, group_id=groups[i % 100])
        params["trace_context"] = None
        await (await raw.execute(statement, params, prepare=True)).fetchall()

    async def plain_insert(i: int) -> None:
        await (await plain.execute(insert, ("noop", groups[i % 100], "{}"),
                                   prepare=True)).fetchall()

    async def plain_nofair(i: int) -> None:
        await (await plain.execute(nofair, ("noop", groups[i % 100], "{}"),
                                   prepare=True)).fetchall()

    async def select_1(i: int) -> None:
        await (await plain.execute("SELECT 1", prepare=True)).fetchall()

    out: dict[str, Call] = {"rota": rota, "rota statement, raw": rota_raw,
                            "insert, triggers": plain_insert,
                            "insert, no fair trigger": plain_nofair, "select 1": select_1}
    closers: list[Callable[[], Awaitable[None]]] = [queue.close, raw.close, plain.close]
    from pgqueuer.queries import Queries

    for driver in ("asyncpg", "psycopg"):
        drv, close = await pgqueuer_connect(
            database(url, f"bench_enqueue_profile_pgq_{driver}"), driver)
        queries = Queries(drv)
        await queries.install()

        async def pgq(i: int, queries: Queries = queries) -> None:
            await queries.enqueue("noop", b"x")

        out[f"pgqueuer ({driver})"] = pgq
        closers.append(close)
    return out, closers


async def measure(url: str, rounds: int, n: int) -> dict[str, tuple[float, float]]:
    calls, closers = await variants(url)
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    try:
        for call in calls.values():  # warm up: connections, prepared statements
            for i in range(50):
                await call(i)
        for _ in range(rounds):
            for name, call in calls.items():
                t, c = time.perf_counter(), time.process_time()
                for i in range(n):
                    await call(i)
                wall[name].append((time.perf_counter() - t) / n * 1000)
                cpu[name].append((time.process_time() - c) / n * 1000)
    finally:
        for close in closers:
            await close()
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in calls}


def main(url: str, rounds: int = 7, n: int = 500) -> None:
    result = asyncio.run(measure(url, rounds, n))
    print("| variant | ms per call (wall) | client CPU ms per call | calls/s |")
    print("|---|---:|---:|---:|")
    for name, (w, c) in result.items():
        print(f"| {name} | {w:.3f} | {c:.3f} | {1000 / w:,.0f} |")


if __name__ == "__main__":
    main(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
         *(int(a) for a in sys.argv[1:3]))
