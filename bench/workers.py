"""Many workers on one PostgreSQL (part of ``make bench``; alone: ``python -m
bench.workers``): 1, 2, 4 and 8 worker processes, each running the README's starting
point (one ``Stage("t", handler=...)``: the runner sizes the claims, concurrency 1)
back to back.

- **Throughput**: a fresh schema of ready jobs over 1,000 groups and three plans
  (bench/scale.py's bulk build, no history), more than the workers can drain; the
  processes start, connect, wait, and are released together; each runs its pipeline
  for the window. Reported: jobs completed per second over the window (all workers),
  with no-op handlers and with handlers that wait 5 ms (an API call).
- **Fairness**: one group enqueues 5,000 jobs, then 20 small groups 5 each (one plan);
  the workers drain them all. Each handler notes when it started (the machine's clock,
  shared by the processes); the merged order gives the positions. Reported: how many of
  the large group's jobs started before every small group had started one, in all and
  per worker, and the median and last position of the small groups' jobs.

Configurations are interleaved round by round; figures are medians over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from rota import Pipeline, Queue

ROOT = Path(__file__).resolve().parents[1]
WORKERS = (1, 2, 4, 8)
HANDLER_MS = (0.0, 5.0)
GROUPS = 1000
LARGE, SMALL, PER_SMALL = 5_000, 20, 5


async def worker_main(url: str, schema: str, seconds: float, handler_ms: float,
                      drain: bool) -> int:
    """One worker process: ``ready``, wait for ``go`` on stdin, then run the pipeline
    for ``seconds`` (or, with ``drain``, until a run finds no work), and print JSON:
    jobs done and, for each handler call, (start ns, group)."""
    from rota import JobContext, Stage

    queue = Queue(url, schema=schema)
    await queue.open()
    started: list[tuple[int, str | None]] = []

    async def handler(ctx: JobContext) -> None:
        started.append((time.time_ns(), ctx.job.group_id))
        if handler_ms:
            await asyncio.sleep(handler_ms / 1000)

    pipeline = Pipeline(queue, [Stage("t", handler=handler)])
    async with queue.connection() as conn:  # warm a pooled connection
        await conn.execute("SELECT 1")
    done = await run_window(queue, pipeline, seconds, drain)
    print(json.dumps({"done": done, "started": started}), flush=True)
    return 0


async def run_window(queue: Queue, pipeline: Pipeline, seconds: float,
                     drain: bool = False) -> int:
    """Say ``ready``, wait for ``go`` on stdin, then run ``pipeline`` back to back for
    ``seconds`` (with ``drain``, stop at a run that finds no work); close ``queue``.
    Returns the jobs done."""
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    done = 0
    end = time.monotonic() + seconds
    try:
        while (left := end - time.monotonic()) > 0.05:
            result = await pipeline.run(trigger="manual",
                                        time_budget=timedelta(seconds=min(left, 2.0)))
            done += result.jobs_done
            if drain and result.stop_reason == "no_work" and result.jobs_done == 0:
                break
    finally:
        await queue.close()
    return done


def release_together(spawn: Callable[[int], subprocess.Popen[bytes]], n: int,
                     timeout: float) -> list[dict[str, Any]]:
    """Start ``n`` worker processes (``spawn(i)``, stdin and stdout piped), wait until
    each says ``ready``, send every one ``go``, and return the JSON each prints last;
    processes still running at the end are killed."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(n):
            procs.append(spawn(i))
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != b"ready":
                raise RuntimeError(f"a bench worker did not start: {line!r}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
            p.stdin.flush()
        return [json.loads(p.communicate(timeout=timeout)[0].decode().splitlines()[-1])
                for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def run_workers(url: str, schema: str, workers: int, seconds: float, handler_ms: float,
                drain: bool) -> list[dict[str, Any]]:
    """Start ``workers`` processes, release them together, return their JSON outputs."""
    return release_together(lambda _: subprocess.Popen(
        [sys.executable, "-m", "bench.workers", "worker", "--url", url,
         "--schema", schema, "--seconds", str(seconds),
         "--handler-ms", str(handler_ms)] + (["--drain"] if drain else []),
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)}), workers, seconds + 120)


async def drop(url: str, schema: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
            sql.Identifier(schema)))


async def build_fairness(url: str, schema: str) -> None:
    from rota import Queue

    queue = Queue(url, schema=schema)
    await queue.open()
    try:
        await drop(url, schema)
        await queue.migrate()
        for g in ["large", *(f"small{i}" for i in range(SMALL))]:
            await queue.upsert_group(g, plan="free")
        for k in range(0, LARGE, 1000):
            await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": "large"}
                                      for _ in range(k, min(LARGE, k + 1000))])
        await queue.enqueue_many([{"type": "t", "payload": {}, "group_id": f"small{i}"}
                                  for i in range(SMALL) for _ in range(PER_SMALL)])
    finally:
        await queue.close()


def sample_waits(url: str, app: str, stop: threading.Event) -> collections.Counter[str]:
    """Every 20 ms until ``stop``: what each of the workers' sessions is doing
    (pg_stat_activity: the wait event, "CPU" for an active session not waiting, "idle"
    and "idle in transaction" otherwise; "ClientRead" is a session waiting for its
    client)."""
    seen: collections.Counter[str] = collections.Counter()
    with psycopg.connect(url, autocommit=True) as c:
        while not stop.wait(0.02):
            for wtype, wevent, state in c.execute(
                    "SELECT wait_event_type, wait_event, state FROM pg_stat_activity "
                    "WHERE application_name = %s", [app]):
                if state == "active":
                    seen[f"{wtype}:{wevent}" if wtype else "CPU"] += 1
                else:
                    seen[f"{state}" + (f" ({wevent})" if wevent else "")] += 1
    return seen


def throughput(url: str, workers: int, handler_ms: float, seconds: float,
               jobs: int) -> tuple[float, dict[str, float]]:
    """Jobs/s of ``workers`` processes over the window, and the share of each thing
    their database sessions were seen doing (:func:`sample_waits`)."""
    from .scale import build

    schema = f"bench_workers_{uuid.uuid4().hex[:8]}"
    app = f"bench-{schema}"
    asyncio.run(build(url, schema, pending=jobs, groups=GROUPS, done=0))
    stop = threading.Event()
    waits: collections.Counter[str] = collections.Counter()
    sampler = threading.Thread(target=lambda: waits.update(sample_waits(url, app, stop)))
    sampler.start()
    try:
        outs = run_workers(make_conninfo(url, application_name=app), schema, workers,
                           seconds, handler_ms, drain=False)
    finally:
        stop.set()
        sampler.join()
        asyncio.run(drop(url, schema))
    done = sum(o["done"] for o in outs)
    if done >= jobs:
        raise RuntimeError(f"{workers} workers drained all {jobs} jobs: raise the jobs")
    total = sum(waits.values()) or 1
    return done / seconds, {k: n / total for k, n in waits.most_common(6)}


def fairness(url: str, workers: int) -> dict[str, Any]:
    """Positions of the 5,000-against-20x5 case drained by ``workers`` processes."""
    schema = f"bench_workers_{uuid.uuid4().hex[:8]}"
    asyncio.run(build_fairness(url, schema))
    try:
        outs = run_workers(url, schema, workers, 300.0, 0.0, drain=True)
    finally:
        asyncio.run(drop(url, schema))
    order = [g for _, g in sorted(s for o in outs for s in o["started"])]
    total = LARGE + SMALL * PER_SMALL
    if len(order) != total:
        raise RuntimeError(f"{workers} workers ran {len(order)} jobs of {total}")
    firsts = [order.index(f"small{i}") for i in range(SMALL)]
    last_first = max(firsts)
    large_before = sum(1 for g in order[:last_first] if g == "large")
    small_pos = [i for i, g in enumerate(order) if g != "large"]
    return {"large_before_all_small": large_before,
            "per_worker": large_before / workers,
            "small_median": statistics.median(small_pos), "small_last": max(small_pos)}


def main(url: str, rounds: int = 3, seconds: float = 6.0, jobs: int = 300_000
         ) -> dict[str, Any]:
    print(f"\nmany workers: {WORKERS} processes, the README's Stage, {rounds} rounds",
          flush=True)
    rates: dict[str, list[float]] = {f"{w}/{h:g}": [] for w in WORKERS for h in HANDLER_MS}
    fair: dict[int, list[dict[str, Any]]] = {w: [] for w in WORKERS}
    waits: dict[str, dict[str, float]] = {}  # the last round's
    for r in range(rounds):
        for w in WORKERS:
            for h in HANDLER_MS:
                # 5 ms handlers at concurrency 1 run at most 200 jobs/s a worker.
                n = jobs if not h else max(5_000, int(w * 250 * seconds))
                rate, seen = throughput(url, w, h, seconds, n)
                rates[f"{w}/{h:g}"].append(rate)
                waits[f"{w}/{h:g}"] = seen
                print(f"  round {r + 1}: {w} workers, {h:g} ms handlers: {rate:,.0f} jobs/s; "
                      f"sessions: " + ", ".join(f"{k} {v:.0%}" for k, v in seen.items()),
                      flush=True)
            f = fairness(url, w)
            fair[w].append(f)
            print(f"  round {r + 1}: {w} workers, fairness: {f}", flush=True)
    result = {"workers": {}}
    for w in WORKERS:
        fs = fair[w]
        result["workers"][str(w)] = {
            **{f"jobs_per_s_{h:g}ms": statistics.median(rates[f"{w}/{h:g}"])
               for h in HANDLER_MS},
            **{k: statistics.median(f[k] for f in fs) for k in fs[0]},
            "sessions": {f"{h:g}ms": waits[f"{w}/{h:g}"] for h in HANDLER_MS},
            "rounds": {"rates": {h: rates[f"{w}/{h:g}"] for h in HANDLER_MS}, "fairness": fs}}
    print(report(result))
    return result


def report(r: dict[str, Any]) -> str:
    lines = ["| workers | jobs/s, no-op | jobs/s, 5 ms handlers | large before every small "
             "group started | per worker | small jobs: median position | last |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for w, v in r["workers"].items():
        lines.append(f"| {w} | {v['jobs_per_s_0ms']:,.0f} | {v['jobs_per_s_5ms']:,.0f} | "
                     f"{v['large_before_all_small']:g} | {v['per_worker']:.1f} | "
                     f"{v['small_median']:g} | {v['small_last']:g} |")
    lines += ["", "What the workers' database sessions were seen doing (no-op handlers, "
              "sampled every 20 ms):", "", "| workers | sessions |", "|---:|---|"]
    for w, v in r["workers"].items():
        lines.append(f"| {w} | " + ", ".join(
            f"{k} {x:.0%}" for k, x in v["sessions"]["0ms"].items()) + " |")
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.workers")
    sub = p.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--url", required=True)
    w.add_argument("--schema", required=True)
    w.add_argument("--seconds", type=float, required=True)
    w.add_argument("--handler-ms", type=float, default=0.0)
    w.add_argument("--drain", action="store_true")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=6.0)
    a = p.parse_args(argv)
    if a.cmd == "worker":
        return asyncio.run(worker_main(a.url, a.schema, a.seconds, a.handler_ms, a.drain))
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    main(url, a.rounds, a.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
