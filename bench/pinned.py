"""The claim while the xmin horizon is pinned (docs/operations.md, "Long transactions").

A long transaction anywhere in the database (an analytics query, ``pg_dump``, a session
left idle in transaction) pins the xmin horizon: vacuum can remove no row version newer
than it. This part measures what that does to rota's claim, against an unfair FIFO
``FOR UPDATE SKIP LOCKED`` claim on the same table at the same moments.

Data: ``pending`` ready jobs over ``groups`` groups in three plans, ``pending // 5`` done
jobs in the served window (``bench/scale.py``'s build). A worker loop claims 100,
completes them and enqueues 100 more; between two of its cycles, a pair of samples is
taken, one rota claim of 25 (``Queue.claim``) and one FIFO claim of 25, in alternating
order, each completing and replacing what it took; only those two claims are timed.
The loop and the samples take turns on one queue rather than running at once: two rota
claimers at once make each other's claims retry with larger probes (see
docs/fast-claim.md, "Locked candidates"), which is another measurement.

**Flat out** (``--flat-out``): the loop runs with no pause, as its own task on its own
connection (claim 100, complete them, enqueue 100, again), and a second task takes the
sample pairs at the same moments, a pair every ``PAUSE`` seconds. So the claims measured
meet a worker that churns as fast as it can (and its locks: two rota claimers at once),
and dead row versions pile up at the rate that worker sets. Each moment also reports the
loop's rate (jobs claimed and completed per second over the moment's window), the dead
tuples of ``jobs``, and the claim retries (``FairClaim.retries``) since the start.
``--explain`` (with ``--flat-out``) also prints, before the pin, at its end and 30 s
after the release, the claim of 25 under EXPLAIN (ANALYZE, BUFFERS)
(``bench/experiments/pinned_explain.py``, the generic plan the claim runs): the plan
nodes that read the most buffers, while the loop runs.

Moments: ``before`` (the last ``WINDOW`` seconds before the pin), ``pinned N s`` (the
last ``WINDOW`` seconds of the first N seconds of the pin: a REPEATABLE READ transaction
on another connection that has read, so it holds a snapshot; with ``--pin-xid`` it
also takes an xid, as a transaction that wrote and stays open holds one) and ``after
release``
(``AFTER - WINDOW`` to ``AFTER`` seconds after that transaction ends). Each moment
reports both p50s, their ratio, rota's p50 against its own ``before``, and the dead
tuples in the schema (``pg_stat_user_tables``, as the statistics collector last saw
them).

Usage: ``python -m bench.pinned [--quick | --size PENDING/GROUPS [--pins S[,S...]]]
[--flat-out [--explain]] [--pin-xid]``
(DATABASE_URL, default the local test database). ``--quick``: 100,000 pending jobs over
2,000 groups, pinned 60 s. ``--size``: one size, pinned ``--pins`` seconds (default 60).
Without either: 100,000 over 2,000 and 1,000,000 over 10,000, each pinned 10 minutes
(reported at 60 s and at 10 min).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

from .scale import build, fifo_claim

SCHEMA = "bench_pinned"
WINDOW = 10.0  # seconds of samples behind each moment
LEAD = 20.0  # seconds of churn before the pin (the last WINDOW of them is "before")
AFTER = 30.0  # the "after release" moment ends this long after the release
PAUSE = 0.01  # seconds between two sample pairs
QUICK = ((100_000, 2_000, (60,)),)
FULL = ((100_000, 2_000, (60, 600)), (1_000_000, 10_000, (60, 600)))


def _replacements(n: int, groups: int, rng: random.Random) -> list[dict[str, Any]]:
    return [{"type": "t", "payload": {}, "group_id": f"g{rng.randrange(groups)}"}
            for _ in range(n)]


@dataclass
class Samples:
    """Claim times (ms) by claimer (``rota``, ``fifo``), each with the monotonic time it
    was taken."""

    times: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    def p50(self, name: str, start: float, end: float) -> float | None:
        xs = [ms for t, ms in self.times.get(name, []) if start <= t < end]
        return statistics.median(xs) if xs else None

    def count(self, start: float, end: float) -> int:
        return sum(1 for t, _ in self.times.get("rota", []) if start <= t < end)


async def dead_tuples(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """Dead tuples per table of the schema, and their sum (``total``)."""
    cur = await conn.execute("SELECT relname, n_dead_tup FROM pg_stat_user_tables "
                             "WHERE schemaname = %s", [SCHEMA])
    rows = {r[0]: int(r[1]) for r in await cur.fetchall()}
    return {"total": sum(rows.values()), **{k: rows.get(k, 0) for k in
                                            ("jobs", "fair_groups", "fair_served")}}


async def horizon_seconds(conn: psycopg.AsyncConnection[Any]) -> float:
    from rota.db import statement_text

    cur = await conn.execute(statement_text("horizon_age"))
    row = await cur.fetchone()
    return float(row[0]) if row else 0.0


async def scenario(url: str, pending: int, groups: int, pins: tuple[int, ...],
                   flat_out: bool = False, explain: bool = False,
                   pin_xid: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    await build(url, SCHEMA, pending=pending, groups=groups, done=pending // 5)
    print(f"built {pending:,} pending over {groups:,} groups in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    cycles = 0
    churned: list[tuple[float, int]] = []  # (monotonic time, jobs) per churn cycle
    plans: list[tuple[str, Any]] = []  # (label, EXPLAIN plan) with --explain
    rng = random.Random(11)
    samples = Samples()
    done = sql.SQL("UPDATE {}.jobs SET status = 'done', finished_at = now(), "
                   "locked_at = NULL, claim_token = NULL WHERE id = ANY(%s)").format(
                       sql.Identifier(SCHEMA))
    moments: list[dict[str, Any]] = []
    queue = Queue(url, schema=SCHEMA)
    async with (queue,
                await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
                await psycopg.AsyncConnection.connect(url, autocommit=True) as stats,
                await psycopg.AsyncConnection.connect(url) as holder):

        async def pair(first_rota: bool) -> None:
            names = ["rota", "fifo"]
            for name in names if first_rota else reversed(names):
                t = time.perf_counter()
                if name == "rota":
                    jobs = await queue.claim("t", 25)
                    ms = (time.perf_counter() - t) * 1000
                    if jobs:
                        await queue.complete_many(jobs)
                    n = len(jobs)
                else:
                    cur = await conn.execute(fifo_claim(queue), {"type": "t", "limit": 25})
                    ids = [r[0] for r in await cur.fetchall()]
                    ms = (time.perf_counter() - t) * 1000
                    await conn.execute(done, [ids])
                    n = len(ids)
                samples.times.setdefault(name, []).append((time.monotonic(), ms))
                if n:
                    await queue.enqueue_many(_replacements(n, groups, rng))

        async def churn() -> None:
            nonlocal cycles
            jobs = await queue.claim("t", 100)
            if jobs:
                await queue.complete_many(jobs)
            await queue.enqueue_many(_replacements(len(jobs) or 100, groups, rng))
            cycles += 1
            churned.append((time.monotonic(), len(jobs)))

        async def churn_flat_out() -> None:
            while True:  # cancelled at the end of the scenario
                await churn()

        async def sample_until(end: float) -> None:
            i = 0
            while time.monotonic() < end:
                if not flat_out:  # flat out, the churn runs as its own task
                    await churn()
                await pair(i % 2 == 0)
                i += 1
                await asyncio.sleep(PAUSE)

        async def look(label: str) -> None:
            if explain:
                from .experiments.pinned_explain import explain as explain_claim

                plans.append((label, await explain_claim(queue)))

        async def moment(label: str, start: float, end: float) -> dict[str, Any]:
            rota_p50 = samples.p50("rota", start, end)
            fifo_p50 = samples.p50("fifo", start, end)
            m = {"pending": pending, "groups": groups, "moment": label,
                 "rota_p50": rota_p50, "fifo_p50": fifo_p50,
                 "pairs": samples.count(start, end), "dead": await dead_tuples(stats),
                 "horizon_s": await horizon_seconds(stats), "churn_cycles": cycles,
                 "churn_jobs_s": sum(n for t, n in churned if start <= t < end)
                 / (end - start),
                 "retries": queue.fair_claim.retries.get("t", 0),
                 "flat_out": flat_out}
            moments.append(m)
            print(row(m, moments[0]["rota_p50"] if moments else None), flush=True)
            return m

        began = time.monotonic()
        loop = asyncio.create_task(churn_flat_out()) if flat_out else None
        await sample_until(began + LEAD)
        await moment("before", began + LEAD - WINDOW, began + LEAD)
        await look("before the pin")
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}.groups").format(
            sql.Identifier(SCHEMA)))  # the snapshot is taken, and held from here
        if pin_xid:  # and an xid, as a transaction that wrote and stays open holds one
            await holder.execute("SELECT pg_current_xact_id()")
        pinned = time.monotonic()
        for secs in pins:
            await sample_until(pinned + secs)
            await moment(f"pinned {secs} s", pinned + secs - WINDOW, pinned + secs)
        await look(f"pinned {pins[-1]} s")
        await holder.rollback()
        released = time.monotonic()
        await sample_until(released + AFTER)
        await moment(f"{AFTER:.0f} s after release", released + AFTER - WINDOW,
                     released + AFTER)
        await look(f"{AFTER:.0f} s after release")
        if loop is not None:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        if plans:
            from .experiments.pinned_explain import top_nodes

            for label, plan in plans:
                root = plan[0]["Plan"]
                print(f"\n== EXPLAIN of the claim of 25, {label}: "
                      f"{plan[0]['Execution Time']:.1f} ms, "
                      f"{root['Shared Hit Blocks'] + root.get('Shared Read Blocks', 0)} "
                      "buffers", flush=True)
                for b, node in top_nodes(plan, 16):
                    print(f"{b:>8}  {node}", flush=True)
        # The contract of the fair claim's bookkeeping (rota verify) after the churn:
        # a pinned horizon slows the claim, it must never make the bookkeeping wrong.
        violations = await queue.verify()
        print(f"rota verify after the pin: {len(violations)} violations", flush=True)
        if violations:
            raise SystemExit("the fair claim's bookkeeping broke its contract: "
                             + "; ".join(map(str, violations[:5])))
    return {"pending": pending, "groups": groups, "moments": moments, "violations": 0,
            "flat_out": flat_out}


def header(flat_out: bool = False) -> str:
    extra = " churn (jobs/s) | dead jobs | claim retries |" if flat_out else ""
    return ("| pending / groups | moment | rota p50 (ms) | FIFO p50 (ms) | rota / FIFO | "
            "rota / own before | pairs | dead tuples (schema) | of them fair_groups, "
            "fair_served | horizon age (s) |" + extra
            + "\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
            + ("---:|---:|---:|" if flat_out else ""))


def row(m: dict[str, Any], before: float | None) -> str:
    r, f = m["rota_p50"], m["fifo_p50"]
    ratio = f"{r / f:.1f}x" if r and f else "-"
    own = f"{r / before:.2f}x" if r and before else "-"
    extra = (f" {m['churn_jobs_s']:,.0f} | {m['dead']['jobs']:,} | {m['retries']} |"
             if m.get("flat_out") else "")
    return (f"| {m['pending']:,} / {m['groups']:,} | {m['moment']} | "
            f"{r or 0:.2f} | {f or 0:.2f} | {ratio} | {own} | {m['pairs']} | "
            f"{m['dead']['total']:,} | {m['dead']['fair_groups']:,}, "
            f"{m['dead']['fair_served']:,} | {m['horizon_s']:.0f} |" + extra)


def report(results: list[dict[str, Any]]) -> str:
    lines = [header(any(r.get("flat_out") for r in results))]
    for r in results:
        before = r["moments"][0]["rota_p50"] if r["moments"] else None
        lines += [row(m, before) for m in r["moments"]]
    return "\n".join(lines)


def main(url: str, *, sizes: tuple[tuple[int, int, tuple[int, ...]], ...] = FULL,
         flat_out: bool = False, explain: bool = False,
         pin_xid: bool = False) -> list[dict[str, Any]]:
    """Run the scenario at each size (``(pending, groups, pins in seconds)``: ``QUICK``,
    ``FULL`` or one asked for), paced or ``flat_out`` (with ``explain``: the claim's
    plan before the pin, at its end and after the release; with ``pin_xid``: the pinning
    transaction holds an xid too, as one that wrote and stays open); returns per size its
    moments (p50s in ms, dead tuples, the horizon's age; flat out, the churn's jobs/s).
    The schema is dropped after."""
    print(header(flat_out), flush=True)
    out = [asyncio.run(scenario(url, pending, groups, pins, flat_out, explain, pin_xid))
           for pending, groups, pins in sizes]
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    return out


def _size(text: str) -> tuple[int, int]:
    """``PENDING/GROUPS`` as two integers, groups at least 1 and at most pending."""
    parts = text.split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not PENDING/GROUPS (two whole "
                                         f"numbers, e.g. 1000000/10000)")
    pending, groups = int(parts[0]), int(parts[1])
    if not 1 <= groups <= pending:
        raise argparse.ArgumentTypeError(f"{text!r}: groups must be at least 1 and at "
                                         f"most the pending jobs")
    return pending, groups


def _pins(text: str) -> tuple[int, ...]:
    """``S[,S...]``: whole seconds, increasing, each at least ``WINDOW`` (a moment is the
    median of the ``WINDOW`` seconds of samples before it, which must all be pinned)."""
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not S[,S...] (whole seconds, "
                                         f"e.g. 60,600)")
    pins = tuple(int(p) for p in parts)
    if pins[0] < WINDOW or any(b <= a for a, b in itertools.pairwise(pins)):
        raise argparse.ArgumentTypeError(f"{text!r}: pins must increase and be at least "
                                         f"{WINDOW:g} s (each moment is the median of the "
                                         f"{WINDOW:g} s of samples before it)")
    return pins


Sizes = tuple[tuple[int, int, tuple[int, ...]], ...]


def parse(argv: list[str]) -> tuple[Sizes, bool, bool, bool]:
    """What ``argv`` asks for: the sizes (``--quick``: ``QUICK``; ``--size
    PENDING/GROUPS`` with ``--pins SECONDS[,SECONDS...]``, default 60; nothing:
    ``FULL``), whether the loop runs flat out (``--flat-out``), whether to print the
    claim's plan (``--explain``, with ``--flat-out``), and whether the pinning
    transaction takes an xid (``--pin-xid``).

    Raises:
        SystemExit: an unknown argument, ``--quick`` with ``--size``, ``--pins``
            without ``--size``, ``--explain`` without ``--flat-out``, or a malformed
            size or pin list; argparse prints what was wrong (exit status 2).
    """
    parser = argparse.ArgumentParser(prog="python -m bench.pinned",
                                     description="The claim while the xmin horizon is "
                                                 "pinned, against a FIFO claim.")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--quick", action="store_true",
                       help="100,000 pending over 2,000 groups, pinned 60 s")
    which.add_argument("--size", type=_size, metavar="PENDING/GROUPS",
                       help="one size (default: 100,000/2,000 and 1,000,000/10,000, "
                            "pinned 60 s and 10 min)")
    parser.add_argument("--pins", type=_pins, metavar="S[,S...]",
                        help="with --size: the moments of the pin to report (default 60)")
    parser.add_argument("--flat-out", action="store_true",
                        help="the churn loop runs with no pause, as its own task; the "
                             "samples are taken by another")
    parser.add_argument("--explain", action="store_true",
                        help="with --flat-out: print the claim's EXPLAIN (ANALYZE, "
                             "BUFFERS) before the pin, at its end and after the release")
    parser.add_argument("--pin-xid", action="store_true",
                        help="the pinning transaction also takes an xid, as one that "
                             "wrote and stays open does")
    args = parser.parse_args(argv)
    if args.pins is not None and args.size is None:
        parser.error("--pins needs --size")
    if args.explain and not args.flat_out:
        parser.error("--explain needs --flat-out")
    if args.quick:
        sizes = QUICK
    elif args.size is None:
        sizes = FULL
    else:
        sizes = ((*args.size, args.pins or (60,)),)
    return sizes, args.flat_out, args.explain, args.pin_xid


def parse_sizes(argv: list[str]) -> Sizes:
    """The sizes ``argv`` asks for (:func:`parse`)."""
    return parse(argv)[0]


if __name__ == "__main__":
    from . import server

    sizes, flat_out, explain, pin_xid = parse(sys.argv[1:])
    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    print(server.describe(url))
    results = main(url, sizes=sizes, flat_out=flat_out, explain=explain, pin_xid=pin_xid)
    out = Path(__file__).parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    name = "pinned_flat_out.json" if flat_out else "pinned.json"
    (out / name).write_text(json.dumps(results, indent=2))
    print("\npinned horizon:\n" + report(results))
