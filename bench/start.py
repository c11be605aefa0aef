"""Enqueue to start: how long a job waits for an idle worker to start it.

An idle worker runs in a process of its own: rota's ``Worker`` running the README's
``Pipeline(queue, [Stage("t", handler=h)])`` with its defaults, and pgqueuer's
``QueueManager.run()`` with its defaults (asyncpg, its documented driver). Both wake on
LISTEN/NOTIFY. This process enqueues ``N`` jobs one at a time, ``SPACING`` apart, and
notes the wall-clock time each ``enqueue`` returned (its commit done); each handler notes
the time it started. The latency is the difference (one machine, one clock); the first
``WARMUP`` jobs are not counted. Each system runs in its own fresh database; the systems
take turns, ``rounds`` rounds.

Usage: ``python -m bench.start [--quick]`` (one round instead of two).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import statistics
import sys
import time
from typing import Any

from .enqueue import database, pgqueuer_connect

N = 200
SPACING = 0.05  # seconds between two enqueues
WARMUP = 5
SYSTEMS = ("rota", "pgqueuer (asyncpg)")


async def _rota_worker(url: str, n: int, ready: Any, out: Any) -> None:
    from rota import Pipeline, Queue, Stage, Worker

    started: list[tuple[int, float]] = []
    stop = asyncio.Event()

    async def h(ctx: Any) -> None:
        started.append((int(ctx.job.payload["i"]), time.time()))
        if len(started) >= n:
            stop.set()

    async with Queue(url, schema="rota_start") as queue:
        worker = Worker(Pipeline(queue, [Stage("t", handler=h)]), maintain_every=None)
        task = asyncio.create_task(worker.run_forever(stop))
        await asyncio.wait_for(worker.listening.wait(), 30)
        await asyncio.sleep(0.5)  # past the wake-up that follows connecting
        ready.set()
        await asyncio.wait_for(task, 60 + n * SPACING * 4)
    out.put(started)


async def _pgqueuer_worker(url: str, n: int, ready: Any, out: Any) -> None:
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries

    drv, close = await pgqueuer_connect(url, "asyncpg")
    started: list[tuple[int, float]] = []
    try:
        qm = QueueManager(Queries(drv))

        @qm.entrypoint("t")
        async def h(job: Job) -> None:
            started.append((int(job.payload or b"-1"), time.time()))
            if len(started) >= n:
                qm.shutdown.set()

        task = asyncio.create_task(qm.run())
        await asyncio.sleep(1.5)  # its listener and first dequeue are up
        ready.set()
        await asyncio.wait_for(task, 60 + n * SPACING * 4)
    finally:
        await close()
    out.put(started)


def worker_process(system: str, url: str, n: int, ready: Any, out: Any) -> None:
    """The idle worker of ``system``: puts ``[(i, started_at), ...]`` on ``out`` after
    ``n`` jobs started."""
    run = _rota_worker if system == "rota" else _pgqueuer_worker
    asyncio.run(run(url, n, ready, out))


async def _enqueuer(system: str, url: str, n: int) -> list[float]:
    """Enqueue ``n`` jobs ``SPACING`` apart; returns each one's commit time."""
    committed: list[float] = []
    if system == "rota":
        from rota import Queue

        async with Queue(url, schema="rota_start") as queue:
            for i in range(n):
                t = time.monotonic()
                await queue.enqueue("t", {"i": i})
                committed.append(time.time())
                await asyncio.sleep(max(0.0, SPACING - (time.monotonic() - t)))
        return committed
    from pgqueuer.queries import Queries

    drv, close = await pgqueuer_connect(url, "asyncpg")
    try:
        queries = Queries(drv)
        for i in range(n):
            t = time.monotonic()
            await queries.enqueue("t", str(i).encode())
            committed.append(time.time())
            await asyncio.sleep(max(0.0, SPACING - (time.monotonic() - t)))
    finally:
        await close()
    return committed


async def _install(system: str, url: str) -> None:
    if system == "rota":
        from rota import Queue

        async with Queue(url, schema="rota_start") as queue:
            await queue.migrate()
        return
    from pgqueuer.queries import Queries

    drv, close = await pgqueuer_connect(url, "asyncpg")
    try:
        await Queries(drv).install()
    finally:
        await close()


def one(system: str, base_url: str, n: int = N) -> list[float]:
    """One round of ``system`` in a fresh database: latencies in ms, warm-up left out."""
    url = database(base_url, "bench_start")
    asyncio.run(_install(system, url))
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    total = n + WARMUP
    proc = ctx.Process(target=worker_process, args=(system, url, total, ready, out))
    proc.start()
    try:
        if not ready.wait(60):
            raise RuntimeError(f"{system}'s worker did not start")
        committed = asyncio.run(_enqueuer(system, url, total))
        started = dict(out.get(timeout=60 + total * SPACING * 4))
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    if len(started) != total:
        raise RuntimeError(f"{system} started {len(started)} of {total} jobs")
    return [(started[i] - committed[i]) * 1000 for i in range(WARMUP, total)]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main(url: str, rounds: int = 2) -> dict[str, Any]:
    """``rounds`` interleaved rounds of :func:`one` per system; returns per system the
    p50, p90, p99 and mean in ms over every round's jobs."""
    print(f"\nenqueue to start: {N} enqueues {SPACING * 1000:.0f} ms apart, idle worker, "
          f"{rounds} round(s)", flush=True)
    got: dict[str, list[float]] = {s: [] for s in SYSTEMS}
    for r in range(rounds):
        for system in SYSTEMS:
            xs = one(system, url)
            got[system] += xs
            print(f"  round {r + 1} {system}: p50 {pct(xs, 0.5):.1f} ms, "
                  f"p99 {pct(xs, 0.99):.1f} ms", flush=True)
    result = {s: {"p50": pct(xs, 0.5), "p90": pct(xs, 0.9), "p99": pct(xs, 0.99),
                  "mean": statistics.fmean(xs), "n": len(xs)} for s, xs in got.items()}
    print(report(result))
    return result


def report(r: dict[str, Any]) -> str:
    lines = ["| system | p50 (ms) | p90 (ms) | p99 (ms) | mean (ms) | jobs |",
             "|---|---:|---:|---:|---:|---:|"]
    for s, v in r.items():
        lines.append(f"| {s} | {v['p50']:.1f} | {v['p90']:.1f} | {v['p99']:.1f} | "
                     f"{v['mean']:.1f} | {v['n']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"),
         rounds=1 if "--quick" in sys.argv else 2)
