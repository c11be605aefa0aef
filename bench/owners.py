"""Fair between customers: the fairness scenarios and the owner claim's cost
(docs/design.md, "The fair claim"; bench/RESULTS.md, section 16).

Scenarios (one claimer drains in claims of 10, completing each claim; positions count
the jobs handed out, so the figures are exact and do not depend on the machine):

- ``heavy``: a heavy owner (1,000 jobs, one group) and a light one (50 jobs, enqueued
  after): the light owner's last job's position, against 50 when it is alone.
- ``split``: the heavy owner's 1,000 jobs over 20 groups: the same, by group and by owner.
- ``weights``: Pro (weight 4) and Free (weight 1) at one priority, 1,000 jobs each: the
  share of the first 500 against the weights' share, and Jain's index of the shares
  divided by the weights.

Claim cost: at ``--size PENDING/GROUPS/OWNERS`` (default 100,000/2,000/200), the claim of
25 by group and by owner beside the FIFO claim, each followed by completing its jobs and
enqueueing as many (bench/claim_latency.py's churn), medians of ``--reps``.

    python -m bench.owners [--size 1000000/10000/1000] [--reps 100] [--skip-claim]

(DATABASE_URL, default the local test server.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections import Counter
from typing import Any

import psycopg

from rota import Plan, Plans, Queue

from .scale import build, fifo_claim

SCHEMA = "bench_owners"


async def _drain(queue: Queue, total: int) -> list[str]:
    order: list[str] = []
    while len(order) < total:
        jobs = await queue.claim("t", 10)
        if not jobs:
            break
        order += [j.payload["o"] for j in jobs]
        await queue.complete_many(jobs)
    return order


async def _fresh(url: str, **settings: Any) -> Queue:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA}_s CASCADE")
    queue = Queue(url, schema=f"{SCHEMA}_s", **settings)
    await queue.open()
    await queue.migrate()
    return queue


async def _load(queue: Queue, owner: str, plan: str, groups: int, jobs: int) -> None:
    for g in range(groups):
        await queue.upsert_group(f"{owner}-{g}", plan=plan, owner_id=owner)
    await queue.enqueue_many([{"type": "t", "payload": {"o": owner},
                               "group_id": f"{owner}-{i % groups}"} for i in range(jobs)])


async def light_wait(url: str, fair_by: str, heavy_groups: int | None) -> int:
    """The light owner's last job's position (heavy_groups None: the light one alone)."""
    queue = await _fresh(url, fair_by=fair_by)
    try:
        if heavy_groups:
            await _load(queue, "heavy", "pro", heavy_groups, 1000)
        await _load(queue, "light", "pro", 1, 50)
        order = await _drain(queue, 1050 if heavy_groups else 50)
        return max(i + 1 for i, o in enumerate(order) if o == "light")
    finally:
        await queue.close()


async def weighted_shares(url: str, fair_by: str) -> dict[str, int]:
    plans = Plans([Plan("free", "Free", 1, weight=1), Plan("pro", "Pro", 1, weight=4)])
    queue = await _fresh(url, fair_by=fair_by, plans=plans)
    try:
        await _load(queue, "P", "pro", 1, 1000)
        await _load(queue, "F", "free", 1, 1000)
        return dict(Counter(await _drain(queue, 500)))
    finally:
        await queue.close()


def jain(xs: list[float]) -> float:
    """Jain's fairness index of ``xs`` (1.0: all equal)."""
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


async def scenarios(url: str) -> None:
    alone = await light_wait(url, "group", None)
    print("scenario                      fair_by  light's last job  alone  ratio")
    for name, groups in (("heavy owner, 1 group", 1), ("heavy owner over 20 groups", 20)):
        for fair_by in ("group", "owner"):
            wait = await light_wait(url, fair_by, groups)
            print(f"{name:29} {fair_by:7} {wait:16,} {alone:6,} {wait / alone:6.1f}x")
    print("\nweights 4:1 (first 500)       fair_by  Pro  Free  Pro share (goal 80%)  Jain")
    for fair_by in ("group", "owner"):
        s = await weighted_shares(url, fair_by)
        per_weight = [s.get("P", 0) / 4, s.get("F", 0) / 1]
        print(f"{'':29} {fair_by:7} {s.get('P', 0):4} {s.get('F', 0):5} "
              f"{s.get('P', 0) / 500:20.1%}  {jain(per_weight):.3f}")


async def claim_cost(url: str, pending: int, groups: int, owners: int, reps: int) -> None:
    await build(url, SCHEMA, pending=pending, groups=groups, owners=owners, done=pending // 5)
    seq = [0]
    results: dict[str, list[float]] = {"group": [], "owner": [], "fifo": []}
    queues = {fb: Queue(url, schema=SCHEMA, fair_by=fb) for fb in ("group", "owner")}
    for q in queues.values():
        await q.open()
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            fifo = fifo_claim(queues["group"])
            for i in range(reps + 5):
                for name in ("group", "owner", "fifo"):  # turns on the same data
                    t = time.perf_counter()
                    if name == "fifo":  # only the claim is timed, as for rota's
                        cur = await c.execute(fifo, {"type": "t", "limit": 25})
                        ids = [r[0] for r in await cur.fetchall()]
                        dt = time.perf_counter() - t
                        await c.execute(f"UPDATE {SCHEMA}.jobs SET status = 'done', "
                                        "finished_at = now() WHERE id = ANY(%s)", [ids])
                        n = len(ids)
                    else:
                        jobs = await queues[name].claim("t", 25)
                        dt = time.perf_counter() - t
                        await queues[name].complete_many(jobs)
                        n = len(jobs)
                    if i >= 5:
                        results[name].append(dt * 1000)
                    seq[0] += n
                    await queues["group"].enqueue_many([
                        {"type": "t", "payload": {},
                         "group_id": f"g{(seq[0] * 7919 + k) % groups}"} for k in range(n)])
    finally:
        for q in queues.values():
            await q.close()
    fifo_p50 = statistics.median(results["fifo"])
    print(f"\nclaim of 25 at {pending:,} pending / {groups:,} groups / {owners:,} owners, "
          f"p50 of {reps} (ms)")
    for name, times in results.items():
        p50 = statistics.median(times)
        print(f"  {name:6} {p50:8.2f}  {p50 / fifo_p50:6.1f}x FIFO")


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.owners")
    p.add_argument("--size", default="100000/2000/200", help="PENDING/GROUPS/OWNERS")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--skip-claim", action="store_true")
    args = p.parse_args()
    try:
        pending, groups, owners = (int(x) for x in args.size.split("/"))
    except ValueError:
        p.error(f"--size must be PENDING/GROUPS/OWNERS, got {args.size!r}")
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    await scenarios(url)
    if not args.skip_claim:
        await claim_cost(url, pending, groups, owners, args.reps)


if __name__ == "__main__":
    asyncio.run(main())
