"""Drain throughput (issue 4, part 2): N queued no-op jobs processed by one worker
process, for rota (``rota.Worker`` running its pipeline back to back, fair claim on),
procrastinate and pgqueuer, each with its default and its tuned settings, on the same
PostgreSQL (each system in its own database, rebuilt before every drain), interleaved
A B C A B C, medians of the rounds.

Only the drain is timed: from starting the worker to the worker returning with every
job processed. Queues are filled beforehand with each system's batch enqueue. rota's
jobs are spread over 100 groups (one plan), so its claim does the fair ranking."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from .enqueue import database, pgqueuer_connect, slug

# name -> (label, settings)
SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    # rota: a Stage needs a batch; 25 is the claim size the README uses (concurrency
    # defaults to 1). Tuned: claims of 2,000 (prefetch, for I/O-bound handlers, does
    # not help no-op jobs: the drain is bound by the database, not by a round trip).
    # Sweep on this machine (20,000 jobs, 2 runs): batch 500 19-20k, 1,000 24-25k,
    # 2,000 26-28k jobs/s.
    # Default: the README's starting point, Stage("t", handler=h): the runner sizes the
    # claims (docs/design.md, "Batch size"). batch1: one job per claim, the per-job cycle.
    "rota": {"default": {"batch": None, "concurrency": 1},
             "tuned": {"batch": 2000, "concurrency": 8},
             "batch1": {"batch": 1, "concurrency": 1}},
    # procrastinate: one job per fetch; concurrency is its documented knob.
    "procrastinate": {"default": {"concurrency": 1},
                      "tuned": {"concurrency": 10}},
    # pgqueuer: batch_size 10 by default; its docs' throughput setting is a larger batch.
    # Sweep with asyncpg on this machine (2 runs): 100 22.1k, 250 22.8-23.6k, 500
    # 21.3-22.1k, 1,000 18.9-19.8k jobs/s: tuned is its best, 250.
    # With asyncpg (its documented driver) and with psycopg (rota's).
    "pgqueuer (asyncpg)": {"default": {"batch_size": 10, "driver": "asyncpg"},
                           "tuned": {"batch_size": 250, "driver": "asyncpg"},
                           "batch1": {"batch_size": 1, "driver": "asyncpg"}},
    "pgqueuer (psycopg)": {"default": {"batch_size": 10, "driver": "psycopg"},
                           "tuned": {"batch_size": 250, "driver": "psycopg"},
                           "batch1": {"batch_size": 1, "driver": "psycopg"}},
}

Drain = Callable[[str, int, dict[str, Any]], Awaitable[float]]


async def drain_rota(url: str, n: int, opts: dict[str, Any]) -> float:
    from rota import Pipeline, Queue, Stage, Worker

    wait_s = opts.get("handler_s", 0.0)

    queue = Queue(url, schema="rota_drain")
    await queue.open()
    try:
        await queue.migrate()
        groups = [f"g{i}" for i in range(100)]
        for g in groups:
            await queue.upsert_group(g, plan="free")
        for k in range(0, n, 1000):
            await queue.enqueue_many([{"type": "noop", "payload": {}, "group_id": groups[i % 100]}
                                      for i in range(k, min(n, k + 1000))])
        stop = asyncio.Event()
        done = 0

        async def noop(ctx: Any) -> None:
            nonlocal done
            if wait_s:
                await asyncio.sleep(wait_s)  # an I/O-bound handler (an API call)
            done += 1
            if done >= n:
                stop.set()

        pipeline = Pipeline(queue, [Stage("noop", opts["batch"], opts["concurrency"], noop,
                                        prefetch=opts.get("prefetch", False))])
        worker = Worker(pipeline, maintain_every=None, idle_poll=timedelta(seconds=1))
        t = time.perf_counter()
        await worker.run_forever(stop)
        dt = time.perf_counter() - t
        async with queue.connection() as c:
            cur = await c.execute("SELECT count(*) FROM rota_drain.jobs WHERE status = 'done'")
            row = await cur.fetchone()
        assert row is not None and row[0] == n, f"rota drained {row} of {n}"
        return n / dt
    finally:
        await queue.close()


async def drain_pgqueuer(url: str, n: int, opts: dict[str, Any]) -> float:
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    drv, close = await pgqueuer_connect(url, opts["driver"])
    try:
        queries = Queries(drv)
        await queries.install()
        for k in range(0, n, 1000):
            m = min(n, k + 1000) - k
            await queries.enqueue(["noop"] * m, [b"x"] * m, [0] * m)
    finally:
        await close()
    drv, close = await pgqueuer_connect(url, opts["driver"])
    try:
        qm = QueueManager(Queries(drv))
        done = 0

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1

        t = time.perf_counter()
        await qm.run(batch_size=opts["batch_size"], mode=QueueExecutionMode.drain,
                     dequeue_timeout=timedelta(seconds=1))
        dt = time.perf_counter() - t
    finally:
        await close()
    assert done == n, f"pgqueuer drained {done} of {n}"
    return n / dt


async def drain_procrastinate(url: str, n: int, opts: dict[str, Any]) -> float:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))
    done = 0

    @app.task(name="noop")
    async def noop() -> None:
        nonlocal done
        done += 1

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for k in range(0, n, 1000):
            await noop.batch_defer_async(*([{}] * (min(n, k + 1000) - k)))
        t = time.perf_counter()
        await app.run_worker_async(wait=False, install_signal_handlers=False,
                                   concurrency=opts["concurrency"])
        dt = time.perf_counter() - t
    assert done == n, f"procrastinate drained {done} of {n}"
    return n / dt


DRAINS: dict[str, Drain] = {"rota": drain_rota, "procrastinate": drain_procrastinate,
                            "pgqueuer (asyncpg)": drain_pgqueuer,
                            "pgqueuer (psycopg)": drain_pgqueuer}


async def measure(url: str, n: int, rounds: int) -> dict[str, dict[str, Any]]:
    got: dict[str, dict[str, list[float]]] = {
        name: {s: [] for s in SETTINGS[name]} for name in DRAINS}
    for r in range(rounds):  # interleaved: every system and setting once per round
        for setting in ("default", "tuned", "batch1"):
            for name, drain in DRAINS.items():
                if setting not in SETTINGS[name]:
                    continue
                db = database(url, f"bench_drain_{slug(name)}")
                # One job per claim is slow: a tenth of the jobs measure its cycle.
                rate = await drain(db, n // 10 if setting == "batch1" else n,
                                   SETTINGS[name][setting])
                got[name][setting].append(rate)
                print(f"  round {r + 1} {name} {setting}: {rate:,.0f} jobs/s", flush=True)
    return {name: {s: {"median": statistics.median(v), "runs": v,
                       "settings": SETTINGS[name][s]} for s, v in d.items()}
            for name, d in got.items()}


# Stage(prefetch=True) against the same stage without it, for handlers that wait 5 ms
# (an API call), batch and concurrency 100: the claim overlaps the batch's handlers.
PREFETCH_N = 10_000
PREFETCH = {"off": {"batch": 100, "concurrency": 100, "handler_s": 0.005},
            "on": {"batch": 100, "concurrency": 100, "handler_s": 0.005, "prefetch": True}}


async def measure_prefetch(url: str, rounds: int) -> dict[str, Any]:
    got: dict[str, list[float]] = {k: [] for k in PREFETCH}
    for r in range(rounds):
        for k, opts in PREFETCH.items():
            rate = await drain_rota(database(url, "bench_drain_prefetch"), PREFETCH_N, opts)
            got[k].append(rate)
            print(f"  round {r + 1} rota, 5 ms handlers, prefetch {k}: {rate:,.0f} jobs/s",
                  flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    return {"jobs": PREFETCH_N, "runs": got, "median": med, "ratio": med["on"] / med["off"]}


def report(result: dict[str, dict[str, Any]]) -> str:
    def fmt(opts: dict[str, Any]) -> str:
        return ", ".join(f"{k} {v}" for k, v in opts.items() if k != "driver")

    lines = ["| system | default (jobs/s) | tuned (jobs/s) | tuned settings "
             "| batch 1 (ms per job) |",
             "|---|---:|---:|---|---:|"]
    systems = {name: v for name, v in result.items() if name in DRAINS}
    for name, v in systems.items():
        cycle = f"{1000 / v['batch1']['median']:.2f}" if "batch1" in v else "-"
        lines.append(f"| {name} | {v['default']['median']:,.0f} | "
                     f"{v['tuned']['median']:,.0f} | {fmt(v['tuned']['settings'])} "
                     f"| {cycle} |")
    peers = [n for n in systems if n != "rota"]
    best = {s: max(result[p][s]["median"] for p in peers) for s in ("default", "tuned")}
    r = result["rota"]
    lines.append(f"| rota / best peer | {r['default']['median'] / best['default']:.2f}x | "
                 f"{r['tuned']['median'] / best['tuned']:.2f}x | | |")
    return "\n".join(lines)


def main(url: str, n: int = 20_000, rounds: int = 3) -> dict[str, Any]:
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    print(f"\ndrain throughput: {n:,} no-op jobs, one worker, {rounds} rounds", flush=True)
    result: dict[str, Any] = asyncio.run(measure(url, n, rounds))
    print(report(result))
    print(f"\nprefetch: {PREFETCH_N:,} jobs whose handlers wait 5 ms, batch and concurrency "
          f"100, {rounds} rounds", flush=True)
    result["rota prefetch"] = asyncio.run(measure_prefetch(url, rounds))
    print(report_prefetch(result["rota prefetch"]))
    return result


def report_prefetch(r: dict[str, Any]) -> str:
    return ("| rota, 5 ms handlers | prefetch off (jobs/s) | prefetch on (jobs/s) | on / off |\n"
            "|---|---:|---:|---:|\n"
            f"| batch 100, concurrency 100 | {r['median']['off']:,.0f} | "
            f"{r['median']['on']:,.0f} | {r['ratio']:.2f}x |")


if __name__ == "__main__":
    import os
    import sys

    from . import server

    u = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    print(server.describe(u))
    main(u, int(sys.argv[1]) if len(sys.argv) > 1 else 20_000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 1)
