"""Experiment, not shipped: what refilling a batch's free slots (docs/design.md,
"Refill") buys on work of mixed run times. bench/owners.py's mixed costs: owners L1, L2
whose jobs cost 1 unit and H1, H2 whose jobs cost 100, one unit a 50 ms sleep, 16 slots,
about 20 s of work at full use (80 slot-seconds an owner: 1,600 jobs of 50 ms each for
L1 and L2, 16 of 5 s for H1 and H2), fair by owner. The same work drained three ways:

- ``slot loop``: bench/owners.py's worker loop, which claims as slots free (``queue.claim``
  of the free slots after each completion; the reference);
- ``batches``: a ``Pipeline`` with ``Stage("t", handler=..., concurrency=16,
  refill=False)`` run by a ``Worker`` (as bench/drain.py's ``drain_rota``): each claimed
  batch runs to its end before the next claim;
- ``refill``: the same stage with refill (the default).

A handler sleeps its cost x the unit and charges its cost (``ctx.charge``). Prints each
drain's seconds, against the work's 20 s at full use. Real time: the figures are the
machine's. One repetition (it sleeps more than it computes: about 1.5 minutes).

Usage: ``python -m bench.experiments.refill_mixed [--slots N] [--unit S] [--seconds S]``
(DATABASE_URL, default the local test server).
"""

from __future__ import annotations

import argparse
import asyncio
import os

import psycopg

from rota import Queue

from .. import server
from ..owners import MIXED, _load, _run_loop, run_pipeline

SCHEMA = "bench_refill_mixed"


async def fresh(url: str) -> Queue:
    """A new queue in this experiment's own schema, fair by owner."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    queue = Queue(url, schema=SCHEMA, fair_by="owner")
    await queue.open()
    await queue.migrate()
    return queue


async def load(queue: Queue, per_owner: float, unit: float) -> int:
    """Each owner's backlog (``per_owner`` slot-seconds of work); the number of jobs."""
    total = 0
    for owner, cost in MIXED.items():
        n = round(per_owner / (cost * unit))
        await _load(queue, owner, "pro", 1, n)
        total += n
    return total


async def drain_pipeline(queue: Queue, total: int, slots: int, unit: float,
                         refill: bool) -> float:
    """Drain with a ``Worker`` running one stage of ``slots`` concurrency; seconds."""
    _, elapsed = await run_pipeline(queue, total, slots, unit, refill=refill)
    return elapsed


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.experiments.refill_mixed")
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--unit", type=float, default=0.05)
    p.add_argument("--seconds", type=float, default=20.0,
                   help="the work's seconds at full use of the slots")
    args = p.parse_args()
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    print(server.describe(url))
    per_owner = args.slots * args.seconds / len(MIXED)
    print(f"mixed costs: {', '.join(f'{o} x{c}' for o, c in MIXED.items())}; "
          f"{args.slots} slots, a unit {args.unit * 1000:.0f} ms, {args.seconds:g} s of "
          f"work at full use ({per_owner:g} slot-s an owner)")
    times: dict[str, float] = {}
    for name in ("slot loop", "batches", "refill"):
        queue = await fresh(url)
        try:
            total = await load(queue, per_owner, args.unit)
            if name == "slot loop":
                _, times[name] = await _run_loop(url, queue, "rota", args.slots, args.unit)
            else:
                times[name] = await drain_pipeline(queue, total, args.slots, args.unit,
                                                   refill=name == "refill")
        finally:
            await queue.close()
        print(f"  {name:9}  {total:,} jobs  {times[name]:5.1f} s  "
              f"{times[name] / args.seconds:5.2f}x the work  "
              f"{times[name] / times['slot loop']:5.2f}x the slot loop", flush=True)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


if __name__ == "__main__":
    asyncio.run(main())
