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

Mixed costs (``--mixed``, docs/design.md "Cost"; real time, so the figures are the
machine's): owners L1, L2 whose jobs cost 1 unit and H1, H2 whose jobs cost 100, one
plan, all backlogged with the same work (units x seconds a unit). A worker loop keeps
``--slots`` jobs running; a job sleeps its cost x ``--unit`` seconds and completes,
charging its cost (``Queue.complete(cost=)``). Each owner's share of the cost charged in
each ``--window``-second window (goal: its weight's share, 25 %, within +-10 % of it;
Jain's index of the shares over the weights >= 0.95), while every owner still has work;
then the same work drained by a FIFO claim (``FOR UPDATE SKIP LOCKED`` by age) on the
same loop: rota's drain time against FIFO's (goal: at most 5 % longer). Then the same
work drained by rota's own runner (a ``Worker`` running one ``Stage`` of ``--slots``
concurrency whose handler sleeps and charges its cost with ``ctx.charge``: refill on,
docs/design.md "Refill"), with its shares per window and its drain time beside the
others.

Claim cost: at ``--size PENDING/GROUPS/OWNERS`` (default 100,000/2,000/200), the claim
of 25 by group and by owner beside the FIFO claim (the reference of the ratios; in every
other round it returns the claimed rows whole, as rota's claim does: "fifo rows"), each
followed by completing its jobs and enqueueing as many (bench/claim_latency.py's churn),
medians of ``--reps``. With ``--costs``: the done jobs cost 1 or 100 (half each) and
every completion charges 1 or 100 (docs/design.md, "Cost"); with ``--caps``: the Free
plan caps its owners at 2 running (``Plan.max_running``) and 400 jobs are left running,
so some owners are at their cap (docs/design.md, "Caps"); ``--costs-caps``: both.
``--reuse``: the schema the last run built, as it left it (no build, no jobs left
running): an A/B of two checkouts on the very same data and statistics, whose plans a
new build's ANALYZE sample can change. Compare milliseconds, not ratios: the FIFO
claim slows run after run as the jobs table's dead versions pile up (autovacuum off).
``--upkeep-every S``: the claim's upkeep rounds at most every S seconds
(``UpkeepConfig.every``, default 0.02) in both queues: how often the served counts are
folded against what the claim reads unfolded (bench/RESULTS.md, section 33).

    python -m bench.owners [--size 1000000/10000/1000] [--reps 100] [--skip-claim]
                           [--costs] [--caps] [--costs-caps] [--reuse]
                           [--upkeep-every S]
                           [--mixed [--window S] [--windows N]
                           [--slots N] [--unit S]]

(DATABASE_URL, default the local test server.)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
from collections import Counter
from typing import Any

import psycopg
from psycopg import sql

from rota import Plan, Plans, Queue

from . import server
from .scale import FIFO_CLAIM, FIFO_INDEX, PLANS, build, fifo_claim

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


#: The mixed-cost scenario's owners and the cost of each one's jobs.
MIXED = {"L1": 1, "L2": 1, "H1": 100, "H2": 100}


async def mixed_costs(url: str, window: float, windows: int, slots: int,
                      unit: float) -> None:
    """The mixed-cost scenario (module docstring): shares per window, then both drains."""
    per_owner = slots * window * windows / len(MIXED)  # slot-seconds of work each
    print(f"\nmixed costs: {', '.join(f'{o} x{c}' for o, c in MIXED.items())}; "
          f"{slots} slots, a unit {unit * 1000:.0f} ms, {per_owner:,.0f} slot-s of work "
          "an owner (" + ", ".join(f"{o} {round(per_owner / (c * unit)):,} jobs"
                                   for o, c in MIXED.items()) + ")")
    times = {}
    for system in ("rota", "fifo", "runner"):
        queue = await _fresh(url, fair_by="owner")
        try:
            total = 0
            for owner, cost in MIXED.items():
                n = round(per_owner / (cost * unit))
                await _load(queue, owner, "pro", 1, n)
                total += n
            if system == "runner":
                finished, elapsed = await run_pipeline(queue, total, slots, unit)
            else:
                finished, elapsed = await _run_loop(url, queue, system, slots, unit)
        finally:
            await queue.close()
        times[system] = elapsed
        if system != "fifo":
            print(f"  {'the slot loop' if system == 'rota' else 'rota runner'}:")
            _report_windows(finished, window)
    print(f"  drain: rota {times['rota']:.1f} s, FIFO {times['fifo']:.1f} s: "
          f"{times['rota'] / times['fifo'] - 1:+.1%} (goal: at most +5 %); rota's "
          f"runner {times['runner']:.1f} s: {times['runner'] / times['fifo'] - 1:+.1%} "
          f"against FIFO's slot loop")


async def run_pipeline(queue: Queue, total: int, slots: int, unit: float, *,
                       refill: bool = True) -> tuple[list[tuple[float, float, str, int]],
                                                     float]:
    """Drain the mixed-cost work with rota's runner: a ``Worker`` running one stage of
    ``slots`` concurrency (``refill``: docs/design.md, "Refill") whose handler sleeps
    its cost x ``unit`` seconds and charges its cost (``ctx.charge``). Returns (start,
    finish, owner, cost) per job (seconds from the start) and the drain's seconds."""
    from datetime import timedelta

    from rota import JobContext, Pipeline, Stage, Worker

    finished: list[tuple[float, float, str, int]] = []
    stop = asyncio.Event()
    start = time.monotonic()

    async def handler(ctx: JobContext) -> None:
        owner = ctx.job.payload["o"]
        cost = MIXED[owner]
        began = time.monotonic() - start
        await asyncio.sleep(cost * unit)
        ctx.charge(cost)
        finished.append((began, time.monotonic() - start, owner, cost))
        if len(finished) >= total:
            stop.set()

    pipeline = Pipeline(queue, [Stage("t", handler=handler, concurrency=slots,
                                      refill=refill)])
    worker = Worker(pipeline, maintain_every=None, idle_poll=timedelta(seconds=1))
    await worker.run_forever(stop)
    elapsed = time.monotonic() - start
    async with queue.connection() as c:
        cur = await c.execute(sql.SQL("SELECT count(*) FROM {}.jobs WHERE status = 'done'")
                              .format(sql.Identifier(queue.schema)))
        row = await cur.fetchone()
    assert row is not None and row[0] == total, f"the runner drained {row} of {total}"
    return finished, elapsed


async def _run_loop(url: str, queue: Queue, system: str, slots: int,
                    unit: float) -> tuple[list[tuple[float, float, str, int]], float]:
    """Keep ``slots`` jobs running until the queue is drained; returns (start, finish,
    owner, cost) per job (seconds from the loop's start) and the drain's seconds."""
    finished: list[tuple[float, float, str, int]] = []
    running: set[asyncio.Task[None]] = set()
    s = sql.Identifier(queue.schema)
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    if system == "fifo":
        await conn.execute(sql.SQL(FIFO_INDEX).format(schema=s))
    start = time.monotonic()

    async def run(job_id: int, owner: str, job: Any) -> None:
        cost = MIXED[owner]
        began = time.monotonic() - start
        await asyncio.sleep(cost * unit)
        if system == "rota":
            await queue.complete(job, cost=cost)
        else:
            async with queue.connection() as c:
                await c.execute(sql.SQL("UPDATE {}.jobs SET status = 'done', finished_at ="
                                        " now(), locked_at = NULL WHERE id = %s").format(s),
                                [job_id])
        finished.append((began, time.monotonic() - start, owner, cost))

    try:
        while True:
            free = slots - len(running)
            got: list[tuple[int, str, Any]] = []
            if free:
                if system == "rota":
                    got = [(j.id, j.payload["o"], j) for j in await queue.claim("t", free)]
                else:
                    cur = await conn.execute(sql.SQL(FIFO_CLAIM.replace(
                        "RETURNING u.id", "RETURNING u.id, u.payload")).format(schema=s),
                        {"type": "t", "limit": free})
                    got = [(r[0], r[1]["o"], None) for r in await cur.fetchall()]
            for job_id, owner, job in got:
                task = asyncio.ensure_future(run(job_id, owner, job))
                running.add(task)
                task.add_done_callback(running.discard)
            if not got and not running:
                break
            if running and (not got or len(running) >= slots):
                await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await conn.close()
    return finished, time.monotonic() - start


def _report_windows(finished: list[tuple[float, float, str, int]], window: float) -> None:
    """Each owner's share of the cost charged in each window while all had work (every
    owner's last job started after the window's end). A job's cost is spread evenly over
    the time it ran (a 100-unit job running across a window's edge counts in both)."""
    last = {o: max(b for b, _, ow, _ in finished if ow == o) for o in MIXED}
    print(f"  window  {'  '.join(f'{o:>6}' for o in MIXED)}   max off  Jain")
    k = 0
    while (k + 1) * window <= min(last.values()):
        charged = {o: 0.0 for o in MIXED}
        lo, hi = k * window, (k + 1) * window
        for b, e, o, c in finished:
            overlap = min(e, hi) - max(b, lo)
            if overlap > 0:
                charged[o] += c * overlap / max(e - b, 1e-9)
        total = sum(charged.values()) or 1
        shares = [charged[o] / total for o in MIXED]
        fair = 1 / len(MIXED)
        off = max(abs(x - fair) / fair for x in shares)
        print(f"  {k * window:4.0f} s  {'  '.join(f'{x:6.1%}' for x in shares)}"
              f"   {off:6.1%}  {jain(shares):.3f}")
        k += 1


async def claim_cost(url: str, pending: int, groups: int, owners: int, reps: int,
                     costs: bool = False, caps: bool = False, reuse: bool = False,
                     upkeep_every: float | None = None) -> None:
    if not reuse:
        await build(url, SCHEMA, pending=pending, groups=groups, owners=owners,
                    done=pending // 5)
    plans = None
    if costs and not reuse:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await c.execute(f"UPDATE {SCHEMA}.jobs SET cost = 100 WHERE status = 'done'"
                            " AND id % 2 = 0")
            await c.execute(f"SELECT {SCHEMA}.fair_fold('t', now())")
            await c.execute(f"VACUUM ANALYZE {SCHEMA}.jobs")
    if caps:
        plans = Plans([Plan(PLANS[0], "Free", 0, max_running=2), Plan(PLANS[1], "Standard", 1),
                       Plan(PLANS[2], "Pro", 2)])
    settings: dict[str, Any] = {"plans": plans} if plans else {}
    seq = [0]
    # The FIFO turn alternates: its claim returning the ids (the reference of every
    # ratio, as in earlier sections) and returning the claimed rows, as rota's claim and
    # a worker's do ("fifo rows": what the transfer of 25 jobs' columns adds).
    results: dict[str, list[float]] = {"group": [], "owner": [], "fifo": [],
                                       "fifo rows": []}
    queues = {fb: Queue(url, schema=SCHEMA, fair_by=fb, **settings)
              for fb in ("group", "owner")}
    for q in queues.values():
        if upkeep_every is not None:
            q.upkeep.config = dataclasses.replace(q.upkeep.config, every=upkeep_every)
        await q.open()
    if caps and not reuse:  # some owners at their cap: 400 jobs left running
        await queues["group"].claim("t", 400)
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            fifo = fifo_claim(queues["group"])
            fifo_rows = fifo_claim(queues["group"], rows=True)
            for i in range(reps + 5):
                for name in ("group", "owner", "fifo"):  # turns on the same data
                    t = time.perf_counter()
                    if name == "fifo":  # only the claim is timed, as for rota's
                        rows = i % 2 == 0  # the first timed turn (i = 5) the ids' form
                        cur = await c.execute(fifo_rows if rows else fifo,
                                              {"type": "t", "limit": 25})
                        ids = [r[0] for r in await cur.fetchall()]
                        dt = time.perf_counter() - t
                        if rows:
                            name = "fifo rows"
                        await c.execute(f"UPDATE {SCHEMA}.jobs SET status = 'done', "
                                        "finished_at = now() WHERE id = ANY(%s)", [ids])
                        n = len(ids)
                    else:
                        jobs = await queues[name].claim("t", 25)
                        dt = time.perf_counter() - t
                        await queues[name].complete_many(
                            jobs, costs=[1 + 99 * (j.id % 2) for j in jobs]
                            if costs else None)
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
    rows_p50 = statistics.median(results["fifo rows"]) if results["fifo rows"] else None
    print(f"\nclaim of 25 at {pending:,} pending / {groups:,} groups / {owners:,} owners"
          f"{', costs on' if costs else ''}{', caps on' if caps else ''}, "
          f"p50 of {reps} (ms; the FIFO claim's two forms {len(results['fifo'])} and "
          f"{len(results['fifo rows'])})")
    for name, times in results.items():
        if not times:
            continue
        p50 = statistics.median(times)
        extra = ""
        if name in queues:  # the claims that read more than their first probe
            fc = queues[name].fair_claim
            extra = (f"  ({p50 / rows_p50:.1f}x FIFO rows)" if rows_p50 else "") + (
                f"  retries {fc.retries.get('t', 0)}, probe now "
                f"{fc._probe.get(('t', name))}")
        print(f"  {name:9} {p50:8.2f}  {p50 / fifo_p50:6.1f}x FIFO{extra}")


def _positive_seconds(text: str) -> float:
    """``--upkeep-every``'s value, checked before the build (minutes at 1,000,000)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 1e10:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.owners")
    p.add_argument("--size", default="100000/2000/200", help="PENDING/GROUPS/OWNERS")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--skip-claim", action="store_true")
    p.add_argument("--skip-scenarios", action="store_true")
    p.add_argument("--costs-caps", action="store_true", help="--costs and --caps")
    p.add_argument("--costs", action="store_true")
    p.add_argument("--caps", action="store_true")
    p.add_argument("--mixed", action="store_true")
    p.add_argument("--reuse", action="store_true",
                   help="the schema the last claim-cost run built, as it left it")
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--unit", type=float, default=0.05)
    p.add_argument("--upkeep-every", type=_positive_seconds, default=None,
                   help="seconds between a type's upkeep rounds (UpkeepConfig.every; "
                        "the claim-cost run only)")
    args = p.parse_args()
    try:
        pending, groups, owners = (int(x) for x in args.size.split("/"))
    except ValueError:
        p.error(f"--size must be PENDING/GROUPS/OWNERS, got {args.size!r}")
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    print(server.describe(url))
    if not args.skip_scenarios:
        await scenarios(url)
    if args.mixed:
        await mixed_costs(url, args.window, args.windows, args.slots, args.unit)
    if not args.skip_claim:
        await claim_cost(url, pending, groups, owners, args.reps,
                         args.costs or args.costs_caps, args.caps or args.costs_caps,
                         args.reuse, args.upkeep_every)


if __name__ == "__main__":
    asyncio.run(main())
