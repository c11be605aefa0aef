"""Enqueue throughput, single and batch: rota against procrastinate and pgqueuer on the
same PostgreSQL (each in its own database), interleaved A B C A B C, medians of the
rounds. Payloads are minimal for all (an empty JSON object, a one-byte body).

pgqueuer runs twice: with asyncpg, the driver its documentation starts from (and by far
its faster one here), and with psycopg, the driver rota uses. The best peer is the
fastest of all of them."""

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


def slug(name: str) -> str:
    """A database-name-safe form of a system's label."""
    return "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")


#: ``--async-commit``: every system's database commits without waiting for the WAL
#: flush (``synchronous_commit = off``), so that the disk's flush time, which moved the
#: single-enqueue rates 1.5x between runs minutes apart on a shared disk, is out of the
#: comparison and the ratios measure the work each system does per job.
ASYNC_COMMIT = False


def database(url: str, name: str) -> str:
    """A fresh database ``name`` on the server of ``url`` (committing asynchronously
    under ``--async-commit``); returns its URL."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        if ASYNC_COMMIT:
            c.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(
                sql.Identifier(name)))
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


def asyncpg_url(conninfo: str) -> str:
    """The ``postgresql://`` URL asyncpg wants for a psycopg conninfo string."""
    d = psycopg.conninfo.conninfo_to_dict(conninfo)
    auth = str(d.get("user", ""))
    if d.get("password"):
        auth += ":" + str(d["password"])
    host = f"{d.get('host', '127.0.0.1')}:{d.get('port', 5432)}"
    return f"postgresql://{auth + '@' if auth else ''}{host}/{d.get('dbname', '')}"


async def pgqueuer_connect(url: str, driver: str) -> tuple[Any, Callable[[], Awaitable[None]]]:
    """A pgqueuer driver (``asyncpg`` or ``psycopg``) on a new connection, and its closer."""
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver

        aconn = await asyncpg.connect(asyncpg_url(url))
        return AsyncpgDriver(aconn), aconn.close
    from pgqueuer.db import PsycopgDriver

    pconn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    return PsycopgDriver(pconn), pconn.close


async def pgqueuer_runner(url: str, driver: str) -> tuple[Runner, Callable[[], Awaitable[None]]]:
    from pgqueuer.queries import Queries

    drv, close_conn = await pgqueuer_connect(url, driver)
    queries = Queries(drv)
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
        await close_conn()

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


SYSTEMS = ("rota", "pgqueuer (asyncpg)", "pgqueuer (psycopg)", "procrastinate")


async def measure(url: str, rounds: int = 5, single_n: int = 2000,
                  batch_n: int = 20_000, batch: int = 1000,
                  systems: tuple[str, ...] = SYSTEMS) -> dict[str, dict[str, float]]:
    """Median jobs/s per system (of ``systems``, rota first) for single and batch
    enqueue."""
    every: dict[str, Callable[[str], Awaitable[tuple[Runner, Any]]]] = {
        "rota": rota_runner,
        "pgqueuer (asyncpg)": lambda u: pgqueuer_runner(u, "asyncpg"),
        "pgqueuer (psycopg)": lambda u: pgqueuer_runner(u, "psycopg"),
        "procrastinate": procrastinate_runner}
    makers = {name: every[name] for name in systems}
    runners: dict[str, tuple[Runner, Callable[[], Awaitable[None]]]] = {}
    for name, make in makers.items():
        runners[name] = await make(database(url, f"bench_enqueue_{slug(name)}"))
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


def main(url: str, rounds: int = 5, systems: tuple[str, ...] = SYSTEMS) -> dict[str, Any]:
    result = asyncio.run(measure(url, rounds, systems=systems))
    print(report(result))
    return result


if __name__ == "__main__":
    # python -m bench.enqueue [ROUNDS] [--pgqueuer-only] [--async-commit]:
    # --pgqueuer-only leaves procrastinate out (a shorter run against the fastest peers);
    # --async-commit: see ASYNC_COMMIT.
    import os
    import sys

    from . import server

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    ASYNC_COMMIT = "--async-commit" in sys.argv
    print(server.describe(url))
    if ASYNC_COMMIT:
        print("  (--async-commit: every system's database has synchronous_commit = off)")
    main(url, int(args[0]) if args else 5,
         SYSTEMS[:3] if "--pgqueuer-only" in sys.argv else SYSTEMS)
