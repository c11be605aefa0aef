"""Fairness (issue 4, part 4): one large group enqueues 5,000 jobs, then S small groups
5 jobs each; then one worker drains. For the small groups' jobs: the median and max
number of jobs processed before each, and how many of the large group's jobs ran
before each (min, median, max). Scenarios: same plan (S = 20); large group on Pro, small
ones on Free (priority must still win: the large group's jobs go first, so every small
job has all 5,000 before it); S = 2,000.

rota runs with no per-group configuration (its groups exist, all on one plan). Peers run
FIFO (their default) and with their documented mechanisms, configured by hand per
tenant: pgqueuer (asyncpg driver, its documented default) an entrypoint per tenant and
priority (an entrypoint per tenant with concurrency_limit=1 did not finish a drain within
10 minutes here, so it is left out); procrastinate a lock per tenant (per-key serial
execution; needs worker concurrency > 1 to let other tenants through), a queue per
tenant, and priority. On Pro/Free the peers express the plan as job priority (Pro 2,
Free 0), on top of the per-tenant mechanism. Positions are the order in which handlers
started.

Every run is bounded by a timeout and is a row of the report either way. A run that
times out after every small job ran still has final positions (the remaining large
jobs can only come after them), so they are reported with the unfinished drain.

What the peers' mechanisms do with one worker, as measured: pgqueuer dequeues by
(priority, id) across all the entrypoints it serves, and procrastinate fetches by
(priority, id) across all the queues it listens to, so an entrypoint or a queue per
tenant is FIFO. procrastinate's `queueing_lock` is not a per-tenant limit (it allows one
*waiting* job per key: the large tenant could not enqueue its 5,000 jobs), so `lock` is
the one measured. A lock lets another tenant's job through only when the large tenant's
previous job has not yet been marked finished as the next fetch looks, so the order
depends on timing (measured: from about every other job to almost all of the large group
first, from run to run), and it does not keep priority above it. It is
inherently slow: its fetch rejects the candidates in (priority, id) order one by one (a
NOT EXISTS probe each), so every fetch while the large tenant holds its lock walks all of
its waiting jobs (~20 ms at 5,000 here), and a finished job does not wake the worker, so
a held lock's next job is only found by polling (10 ms here, 5 s by default): once the
small groups are done, the large group's jobs run one per empty fetch plus poll, so the
5,100-job drains take about 3 minutes and end at the timeout (with 2,000 groups the
small groups keep the worker busy and the drain takes about a minute)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import psycopg

from .enqueue import database

LARGE = 5_000
PER_SMALL = 5
TIMEOUT_S = 120  # per run: the bench stays bounded whatever a peer does
QUICK_TIMEOUT_S = 75
PROCRASTINATE_POLL_S = 0.01  # a released lock is only seen by polling

Order = list[str]  # group of each processed job, in processing order


def groups(small: int) -> list[str]:
    return [f"s{i}" for i in range(small)]


def asyncpg_url(conninfo: str) -> str:
    """postgresql://user:password@host:port/dbname (what asyncpg takes) from a psycopg
    conninfo string (key=value, what bench.enqueue.database returns)."""
    p = {k: str(v) for k, v in psycopg.conninfo.conninfo_to_dict(conninfo).items()}
    auth = quote(p.get("user", ""), safe="")
    if p.get("password"):
        auth += ":" + quote(p["password"], safe="")
    host = p.get("host", "localhost")
    query = []
    if host.startswith("/"):  # a Unix socket directory goes in the query string
        query.append("host=" + quote(host, safe=""))
        if p.get("port"):
            query.append("port=" + p["port"])
        netloc = ""
    else:
        netloc = f"[{host}]" if ":" in host else host
        if p.get("port"):
            netloc += ":" + p["port"]
    if auth:
        netloc = f"{auth}@{netloc}"
    dsn = f"postgresql://{netloc}/{quote(p.get('dbname', ''), safe='')}"
    return dsn + ("?" + "&".join(query) if query else "")


async def rota_order(url: str, small: int, pro_large: bool, mechanism: str,
                     order: Order) -> None:
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
        stop = asyncio.Event()

        async def handler(ctx: Any) -> None:
            order.append(ctx.job.group_id)
            if len(order) >= total:
                stop.set()

        pipeline = Pipeline(queue, [Stage("t", 100, 8, handler)])
        await Worker(pipeline, maintain_every=None,
                     idle_poll=timedelta(seconds=1)).run_forever(stop)
    finally:
        await queue.close()


def peer_priority(g: str, pro_large: bool, mechanism: str) -> int:
    """Higher runs first for both peers. On Pro/Free every mechanism but FIFO carries the
    plan as priority; on one plan only "priority" uses it, raising the small tenants by
    hand above the large one."""
    if pro_large:
        return 2 if g == "L" and mechanism != "FIFO" else 0
    if mechanism == "priority":
        return 0 if g == "L" else 1
    return 0


async def pgqueuer_order(url: str, small: int, pro_large: bool, mechanism: str,
                         order: Order) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    per_tenant = mechanism == "entrypoint per tenant"

    def entrypoint(g: str) -> str:
        return f"t_{g}" if per_tenant else "t"

    dsn = asyncpg_url(url)
    small_jobs = [g for g in groups(small) for _ in range(PER_SMALL)]
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        for batch in ([["L"] * 1000] * (LARGE // 1000)
                      + [small_jobs[k:k + 1000] for k in range(0, len(small_jobs), 1000)]):
            await queries.enqueue([entrypoint(g) for g in batch], [g.encode() for g in batch],
                                  [peer_priority(g, pro_large, mechanism) for g in batch])
    finally:
        await conn.close()
    conn = await asyncpg.connect(dsn)
    try:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        async def handler(job: Job) -> None:
            order.append((job.payload or b"").decode())

        names = {entrypoint(g) for g in ["L", *groups(small)]}
        for name in sorted(names):
            qm.entrypoint(name)(handler)
        await qm.run(batch_size=10, mode=QueueExecutionMode.drain,
                     dequeue_timeout=timedelta(seconds=1))
    finally:
        await conn.close()


async def procrastinate_order(url: str, small: int, pro_large: bool, mechanism: str,
                              order: Order) -> None:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))
    total = LARGE + small * PER_SMALL
    drained = asyncio.Event()

    @app.task(name="t")
    async def task(g: str) -> None:
        order.append(g)
        if len(order) >= total:
            drained.set()

    def options(g: str) -> dict[str, Any]:
        o: dict[str, Any] = {"priority": peer_priority(g, pro_large, mechanism)}
        if mechanism == "lock per tenant":
            o["lock"] = g
        if mechanism == "queue per tenant":
            o["queue"] = f"q_{g}"
        return o

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for _ in range(LARGE // 1000):
            await task.configure(**options("L")).batch_defer_async(*([{"g": "L"}] * 1000))
        for g in groups(small):
            await task.configure(**options(g)).batch_defer_async(*([{"g": g}] * PER_SMALL))
        # A long-running worker (wait=True), stopped by cancelling it (a graceful stop)
        # once every job ran. wait=False would stop at the first empty fetch, which with
        # locks happens whenever the only fetchable tenant's job is still running.
        worker = asyncio.create_task(app.run_worker_async(
            concurrency=10, install_signal_handlers=False,
            fetch_job_polling_interval=PROCRASTINATE_POLL_S))
        done = asyncio.create_task(drained.wait())
        try:
            await asyncio.wait({worker, done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker  # raises if the worker failed on its own


Run = Callable[[str, int, bool, str, Order], Awaitable[None]]  # appends to the Order

SYSTEMS: dict[str, tuple[Run, list[str]]] = {
    "rota": (rota_order, ["fair claim, no per-group configuration"]),
    "pgqueuer": (pgqueuer_order, ["FIFO", "priority", "entrypoint per tenant"]),
    "procrastinate": (procrastinate_order, ["FIFO", "priority", "lock per tenant",
                                            "queue per tenant"]),
}


def label(mechanism: str, pro: bool) -> str:
    if mechanism == "priority":
        return ("priority by plan (Pro 2, Free 0)" if pro
                else "priority (small tenants raised by hand)")
    if pro and mechanism == "FIFO":
        return "FIFO (plan ignored)"
    if pro and mechanism.endswith("per tenant"):
        return f"{mechanism} + priority by plan"
    return mechanism


def stats(order: Order) -> dict[str, Any]:
    positions, large_before = [], []
    seen_large = 0
    for i, g in enumerate(order):
        if g == "L":
            seen_large += 1
        else:
            positions.append(i)
            large_before.append(seen_large)
    return {"small_median": statistics.median(positions), "small_max": max(positions),
            "large_before_min": min(large_before),
            "large_before_median": statistics.median(large_before),
            "large_before_max": max(large_before)}


SCENARIOS = {
    "same plan, 20 small groups": (20, False),
    "large on Pro, 20 small on Free": (20, True),
    "same plan, 2,000 small groups": (2000, False),
}


def plan(quick: bool) -> list[tuple[str, str, str]]:
    """(scenario, system, mechanism) to run. Left out: a queue per tenant on Pro/Free and
    with 2,000 groups (it is FIFO across queues, see the 20-group row, and 2,000 queues are
    no longer practical); priority with 2,000 groups (raising the small ones by hand is the
    20-group case again). --quick runs procrastinate only with its lock."""
    out = []
    for scenario, (small, pro) in SCENARIOS.items():
        for name, (_, mechanisms) in SYSTEMS.items():
            for m in mechanisms:
                if m == "queue per tenant" and (pro or small > 20):
                    continue
                if m == "priority" and small > 20:
                    continue
                if quick and name == "procrastinate" and m != "lock per tenant":
                    continue
                out.append((scenario, name, m))
    return out


def outcome(row: dict[str, Any]) -> str:
    """How the run ended, for the progress line and the table."""
    if row["finished"]:
        return f"{row['seconds']} s"
    return f"did not finish in {row['seconds']} s"


async def measure(url: str, quick: bool) -> list[dict[str, Any]]:
    timeout = QUICK_TIMEOUT_S if quick else TIMEOUT_S
    rows = []
    for scenario, name, mechanism in plan(quick):
        small, pro = SCENARIOS[scenario]
        expected = LARGE + small * PER_SMALL
        row: dict[str, Any] = {"scenario": scenario, "system": name,
                               "mechanism": label(mechanism, pro), "jobs": expected}
        db = database(url, f"bench_fair_{name}")
        order: Order = []
        t = time.perf_counter()
        try:
            await asyncio.wait_for(SYSTEMS[name][0](db, small, pro, mechanism, order), timeout)
            row.update(finished=True, seconds=round(time.perf_counter() - t, 1))
            assert len(order) == expected, f"{name} {mechanism}: {len(order)} of {expected}"
        except TimeoutError:
            row.update(finished=False, seconds=timeout)
        order = order[:]  # a cancelled worker may still finish its running jobs
        row["small_run"] = sum(g != "L" for g in order)
        row["large_run"] = len(order) - row["small_run"]
        # Once every small job ran, later jobs cannot move them: the positions are final
        # even if the drain of the large group's remaining jobs did not finish.
        row["positions_final"] = row["small_run"] == small * PER_SMALL
        line = f"  {scenario} | {name} | {row['mechanism']}: "
        if row["positions_final"]:
            row.update(stats(order))
            line += (f"median {row['small_median']:,.0f}, max {row['small_max']:,}, large "
                     f"before min/median/max {row['large_before_min']:,}/"
                     f"{row['large_before_median']:,.0f}/{row['large_before_max']:,}; ")
        else:
            line += (f"{row['small_run']:,} of {small * PER_SMALL:,} small and "
                     f"{row['large_run']:,} of {LARGE:,} large jobs ran; ")
        print(line + outcome(row), flush=True)
        rows.append(row)
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    lines = []
    for scenario, (small, _) in SCENARIOS.items():
        sel = [r for r in rows if r["scenario"] == scenario]
        if not sel:
            continue
        rota = next((r for r in sel if r["system"] == "rota" and r["positions_final"]), None)
        lines += [f"\n{scenario} ({LARGE + small * PER_SMALL:,} jobs):",
                  "| system | mechanism | small: median position | small: max position "
                  "| large jobs before a small one: min | median | max "
                  "| max position vs rota | run (enqueue + drain) |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in sel:
            if r["positions_final"]:
                vs = f"{r['small_max'] / max(rota['small_max'], 1):.2g}x" if rota else "–"
                cells = [f"{r['small_median']:,.0f}", f"{r['small_max']:,}",
                         f"{r['large_before_min']:,}", f"{r['large_before_median']:,.0f}",
                         f"{r['large_before_max']:,}", vs]
            else:
                cells = [f"– ({r['small_run']:,} of {small * PER_SMALL:,} small and "
                         f"{r['large_run']:,} of {LARGE:,} large jobs ran)",
                         *["–"] * 5]
            end = outcome(r)
            if not r["finished"] and r["positions_final"]:
                end += " (every small job had run: positions final)"
            lines.append(f"| {r['system']} | {r['mechanism']} | " + " | ".join(cells)
                         + f" | {end} |")
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
