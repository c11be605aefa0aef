"""Fairness (issue 4, part 4): one large group enqueues 5,000 jobs, then S small groups
5 jobs each; then one worker drains. For the small groups' jobs: the median and max
number of jobs processed before each, and how many of the large group's jobs ran
before each. Scenarios: same plan (S = 20); large group on Pro, small ones on Free
(priority must still win: the large group's jobs go first); S = 2,000.

rota runs with no per-group configuration (its groups exist, all on one plan). Peers run
FIFO (their default) and with their documented mechanisms, configured by hand per
tenant: pgqueuer an entrypoint per tenant and priority (an entrypoint per tenant with
concurrency_limit=1 did not finish a drain within 10 minutes here, so it is left out);
procrastinate a lock per tenant (per-key serial execution; needs worker
concurrency > 1 to let other tenants through), a queue per tenant, and priority.
Positions are the order in which handlers started."""

from __future__ import annotations

import asyncio
import logging
import statistics
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from .enqueue import database

LARGE = 5_000
PER_SMALL = 5
TIMEOUT_S = 120  # per drain: the bench stays bounded whatever a peer does

Order = list[str]  # group of each processed job, in processing order


def groups(small: int) -> list[str]:
    return [f"s{i}" for i in range(small)]


async def rota_order(url: str, small: int, pro_large: bool, mechanism: str) -> Order:
    from rota import Pipeline, Queue, Stage, Worker

    queue = Queue(url, schema="rota_fair")
    await queue.open()
    try:
        await queue.migrate()
        await queue.upsert_group("L", plan="pro" if pro_large else "free")
        for g in groups(small):
            await queue.upsert_group(g, plan="free")
        for _ in range(0, LARGE, 1000):
            await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "L"}] * 1000)
        items = [{"type": "t", "payload": {}, "group_id": g}
                 for g in groups(small) for _ in range(PER_SMALL)]
        for k in range(0, len(items), 1000):
            await queue.enqueue_many(items[k:k + 1000])
        total = LARGE + len(items)
        order: Order = []
        stop = asyncio.Event()

        async def handler(ctx: Any) -> None:
            order.append(ctx.job.group_id)
            if len(order) >= total:
                stop.set()

        pipeline = Pipeline(queue, [Stage("t", 100, 8, handler)])
        await Worker(pipeline, maintain_every=None,
                     idle_poll=timedelta(seconds=1)).run_forever(stop)
        return order
    finally:
        await queue.close()


async def pgqueuer_order(url: str, small: int, pro_large: bool, mechanism: str) -> Order:
    import psycopg
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    per_tenant = mechanism == "entrypoint per tenant"
    prio = mechanism == "priority" or pro_large

    def entrypoint(g: str) -> str:
        return f"t_{g}" if per_tenant else "t"

    def priority(g: str) -> int:
        if not prio:
            return 0
        if pro_large:
            return 2 if g == "L" else 0
        return 0 if g == "L" else 1  # by hand: the small tenants above the large one

    small_jobs = [g for g in groups(small) for _ in range(PER_SMALL)]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.install()
        for batch in ([["L"] * 1000] * (LARGE // 1000)
                      + [small_jobs[k:k + 1000] for k in range(0, len(small_jobs), 1000)]):
            await queries.enqueue([entrypoint(g) for g in batch], [g.encode() for g in batch],
                                  [priority(g) for g in batch])
    order: Order = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        async def handler(job: Job) -> None:
            order.append((job.payload or b"").decode())

        names = {entrypoint(g) for g in ["L", *groups(small)]}
        for name in sorted(names):
            qm.entrypoint(name)(handler)
        await qm.run(batch_size=10, mode=QueueExecutionMode.drain,
                     dequeue_timeout=timedelta(seconds=1))
    return order


async def procrastinate_order(url: str, small: int, pro_large: bool, mechanism: str) -> Order:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))
    order: Order = []

    @app.task(name="t")
    async def task(g: str) -> None:
        order.append(g)

    def options(g: str) -> dict[str, Any]:
        o: dict[str, Any] = {}
        if mechanism == "lock per tenant":
            o["lock"] = g
        if mechanism == "queue per tenant":
            o["queue"] = f"q_{g}"
        if pro_large:
            o["priority"] = 2 if g == "L" else 0
        elif mechanism == "priority":
            o["priority"] = 0 if g == "L" else 1
        return o

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for _ in range(LARGE // 1000):
            await task.configure(**options("L")).batch_defer_async(*([{"g": "L"}] * 1000))
        for g in groups(small):
            await task.configure(**options(g)).batch_defer_async(*([{"g": g}] * PER_SMALL))
        total = LARGE + small * PER_SMALL
        # wait=False returns when no job can be fetched, which with locks happens while
        # the fetchable heads are running: start it again until every job ran.
        while len(order) < total:
            await app.run_worker_async(wait=False, install_signal_handlers=False,
                                       concurrency=10)
    return order


SYSTEMS: dict[str, tuple[Callable[[str, int, bool, str], Awaitable[Order]], list[str]]] = {
    "rota": (rota_order, ["fair claim, no per-group configuration"]),
    "pgqueuer": (pgqueuer_order, ["FIFO", "priority", "entrypoint per tenant"]),
    "procrastinate": (procrastinate_order, ["FIFO", "priority", "lock per tenant",
                                            "queue per tenant"]),
}


def stats(order: Order) -> dict[str, Any]:
    positions, large_before = [], []
    seen_large = 0
    for i, g in enumerate(order):
        if g == "L":
            seen_large += 1
        else:
            positions.append(i)
            large_before.append(seen_large)
    return {"jobs": len(order), "small_median": statistics.median(positions),
            "small_max": max(positions),
            "large_before_median": statistics.median(large_before),
            "large_before_max": max(large_before)}


SCENARIOS = {
    "same plan, 20 small groups": (20, False),
    "large on Pro, 20 small on Free": (20, True),
    "same plan, 2,000 small groups": (2000, False),
}


def plan(quick: bool) -> list[tuple[str, str, str]]:
    """(scenario, system, mechanism) to run; the 2,000-group scenario only for the
    mechanisms that can run it (pgqueuer would need 2,000 entrypoints registered in
    the worker, procrastinate runs a lock per tenant; both FIFO for reference)."""
    out = []
    for scenario, (small, pro) in SCENARIOS.items():
        for name, (_, mechanisms) in SYSTEMS.items():
            for m in mechanisms:
                if small > 20 and m in ("queue per tenant", "priority"):
                    continue
                if quick and name == "procrastinate" and m != "lock per tenant":
                    continue
                if pro and m == "queue per tenant":
                    continue
                out.append((scenario, name, m))
    return out


async def measure(url: str, quick: bool) -> list[dict[str, Any]]:
    rows = []
    for scenario, name, mechanism in plan(quick):
        small, pro = SCENARIOS[scenario]
        run = SYSTEMS[name][0]
        try:
            order = await asyncio.wait_for(
                run(database(url, f"bench_fair_{name}"), small, pro, mechanism), TIMEOUT_S)
        except TimeoutError:
            print(f"  {scenario} | {name} | {mechanism}: did not finish in {TIMEOUT_S} s",
                  flush=True)
            continue
        expected = LARGE + small * PER_SMALL
        assert len(order) == expected, f"{name} {mechanism}: {len(order)} of {expected}"
        row = {"scenario": scenario, "system": name, "mechanism": mechanism, **stats(order)}
        print(f"  {scenario} | {name} | {mechanism}: median {row['small_median']:,.0f}, "
              f"max {row['small_max']:,}, large before max {row['large_before_max']:,}",
              flush=True)
        rows.append(row)
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    lines = []
    for scenario in SCENARIOS:
        sel = [r for r in rows if r["scenario"] == scenario]
        if not sel:
            continue
        rota = next(r for r in sel if r["system"] == "rota")
        lines += [f"\n{scenario} ({sel[0]['jobs']:,} jobs):",
                  "| system | mechanism | small: median position | small: max position "
                  "| large jobs before a small one: median | max | max position vs rota |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in sel:
            lines.append(
                f"| {r['system']} | {r['mechanism']} | {r['small_median']:,.0f} | "
                f"{r['small_max']:,} | {r['large_before_median']:,.0f} | "
                f"{r['large_before_max']:,} | "
                f"{r['small_max'] / max(rota['small_max'], 1):.1f}x |")
    return "\n".join(lines)


def main(url: str, quick: bool = False) -> list[dict[str, Any]]:
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    print("\nfairness: 5,000 jobs of one group, then small groups of 5; one worker",
          flush=True)
    rows = asyncio.run(measure(url, quick))
    print(report(rows))
    return rows


if __name__ == "__main__":
    import os
    import sys

    main(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
         "--quick" in sys.argv)
