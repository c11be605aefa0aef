"""Enqueue throughput, single and batch: rota against procrastinate and pgqueuer on the
same PostgreSQL (each in its own database), interleaved A B C A B C, medians of the
rounds. Payloads are minimal for all three (an empty JSON object, a one-byte body)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

Runner = Callable[[int, int], Awaitable[float]]


def database(url: str, name: str) -> str:
    """A fresh database ``name`` on the server of ``url``; returns its URL."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(url, dbname=name)


async def rota_runner(url: str) -> tuple[Runner, Callable[[], Awaitable[None]]]:
    queue = Queue(url, schema="rota_enqueue")
    await queue.open()
    await queue.migrate()
    groups = [f"g{i}" for i in range(100)]
    for g in groups:
        await queue.upsert_group(g, plan="free")

    async def run(n: int, batch: int) -> float:
        t = time.perf_counter()
        if batch == 1:
            for i in range(n):
                await queue.enqueue("noop", {}, group_id=groups[i % 100])
        else:
            for k in range(0, n, batch):
                await queue.enqueue_many(
                    [{"type": "noop", "payload": {}, "group_id": groups[(k + i) % 100]}
                     for i in range(batch)])
        return n / (time.perf_counter() - t)

    async def close() -> None:
        await queue.close()

    return run, close


async def pgqueuer_runner(url: str) -> tuple[Runner, Callable[[], Awaitable[None]]]:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.queries import Queries

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    queries = Queries(PsycopgDriver(conn))
    await queries.install()

    async def run(n: int, batch: int) -> float:
        t = time.perf_counter()
        if batch == 1:
            for _ in range(n):
                await queries.enqueue("noop", b"x")
        else:
            for _ in range(0, n, batch):
                await queries.enqueue(["noop"] * batch, [b"x"] * batch, [0] * batch)
        return n / (time.perf_counter() - t)

    async def close() -> None:
        await conn.close()

    return run, close


async def procrastinate_runner(url: str) -> tuple[Runner, Callable[[], Awaitable[None]]]:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))
    await app.open_async()
    await app.schema_manager.apply_schema_async()

    @app.task(name="noop")
    def noop() -> None:
        return None

    async def run(n: int, batch: int) -> float:
        t = time.perf_counter()
        if batch == 1:
            for _ in range(n):
                await noop.defer_async()
        else:
            for _ in range(0, n, batch):
                await noop.batch_defer_async(*([{}] * batch))
        return n / (time.perf_counter() - t)

    async def close() -> None:
        await app.close_async()

    return run, close


async def measure(url: str, rounds: int = 3, single_n: int = 2000,
                  batch_n: int = 20_000, batch: int = 1000) -> dict[str, dict[str, float]]:
    """Median jobs/s per system for single and batch enqueue."""
    makers = {"rota": rota_runner, "pgqueuer": pgqueuer_runner,
              "procrastinate": procrastinate_runner}
    runners: dict[str, tuple[Runner, Callable[[], Awaitable[None]]]] = {}
    for name, make in makers.items():
        runners[name] = await make(database(url, f"bench_enqueue_{name}"))
    got: dict[str, dict[str, list[float]]] = {n: {"single": [], "batch": []} for n in makers}
    try:
        for name in makers:  # warm up connections and plans
            await runners[name][0](200, 1)
            await runners[name][0](batch, batch)
        for _ in range(rounds):  # interleaved A B C A B C
            for name in makers:
                got[name]["single"].append(await runners[name][0](single_n, 1))
            for name in makers:
                got[name]["batch"].append(await runners[name][0](batch_n, batch))
    finally:
        for _, close in runners.values():
            await close()
    return {n: {k: statistics.median(v) for k, v in d.items()} for n, d in got.items()}


def report(result: dict[str, dict[str, float]]) -> str:
    """A markdown table with ratios to the best peer."""
    best = {k: max(v[k] for n, v in result.items() if n != "rota") for k in ("single", "batch")}
    lines = ["| system | single (jobs/s) | batch of 1000 (jobs/s) |", "|---|---:|---:|"]
    for name, v in result.items():
        lines.append(f"| {name} | {v['single']:,.0f} | {v['batch']:,.0f} |")
    r = result["rota"]
    lines.append(f"| rota / best peer | {r['single'] / best['single']:.2f}x | "
                 f"{r['batch'] / best['batch']:.2f}x |")
    return "\n".join(lines)


def main(url: str) -> dict[str, Any]:
    result = asyncio.run(measure(url))
    print(report(result))
    return result
