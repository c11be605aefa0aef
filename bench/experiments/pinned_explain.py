"""Experiment, not shipped: where the fair claim's reads go while the xmin horizon is
pinned (bench/RESULTS.md, sections 12 and 13). Builds bench/pinned.py's data, churns as
its worker loop does (claim 100, complete, enqueue 100) for ``seconds`` with a
REPEATABLE READ transaction holding the horizon, then runs the claim of 25 under
EXPLAIN (ANALYZE, BUFFERS) in a transaction it rolls back, before the pin and after it,
and prints the plan nodes that read the most buffers.

Usage: ``python -m bench.experiments.pinned_explain [seconds [pending groups]] [--ms]``
(default 60 s, 100,000 pending over 2,000 groups). ``--ms``: the nodes by time instead
of buffers (each CTE and each scan: its total milliseconds over its loops, a CTE's
including what it pulls from the CTEs it reads).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

from ..pinned import _replacements
from ..scale import build

SCHEMA = "bench_pinned_explain"


async def explain(queue: Queue, setting: str = "") -> Any:
    """The claim of 25's plan, run and rolled back (``setting``: a SET LOCAL statement
    run first, to compare a plan the planner did not choose).

    The plan is the generic one the claim runs (``claim_settings.sql``): the statement
    is prepared with PREPARE and run by EXPLAIN EXECUTE. An EXPLAIN of the statement
    with its parameters bound plans it with their values, a custom plan, which the
    claim never runs: at 2,000 groups it knows the probe's LIMIT and reads
    ``fair_groups`` with a seq scan and a sort per plan, where the generic plan walks
    ``fair_groups_walk_idx`` (bench/RESULTS.md, section 19)."""
    fair = queue.fair_claim
    statement = fair.statement()
    # The probe sizes the next claim of 25 would start from (FairClaim remembers them
    # per type and order).
    groups, per, spread = fair._start(("t", "group"), 25)
    params = {"type": "t", "limit": 25, "run_id": None, "offset": queue.clock_offset,
              "stale_after": queue.stale_after, "served_window": queue.served_window,
              **queue.plans.claim_params(), "probe_groups": groups, "probe_per": per,
              "probe_spread": spread, "candidates": 25 * 4 + 16}
    values = statement.params(params)
    # A connection of its own, without psycopg's prepared statements (its ROLLBACK
    # would make psycopg deallocate them all); PREPARE needs the parameters' types,
    # taken from the statement prepared as psycopg sends it.
    async with await psycopg.AsyncConnection.connect(str(queue.pool.conninfo)) as c:
        await c.execute(queue.store.sql("fair/claim_settings"))
        await psycopg.AsyncRawCursor(c).execute(statement.text, values, prepare=True)
        cur = await c.execute("SELECT parameter_types::text[] FROM pg_prepared_statements "
                              "WHERE NOT from_sql")
        types = (await cur.fetchall())[-1][0]
        await c.rollback()
    async with await psycopg.AsyncConnection.connect(
            str(queue.pool.conninfo), autocommit=True, prepare_threshold=None) as c:
        await c.execute(sql.SQL("PREPARE claim ({}) AS ").format(
            sql.SQL(", ").join(map(sql.SQL, types)))
            + sql.SQL(statement.text.replace("%", "%%")))
        await c.execute("BEGIN")
        try:
            await c.execute(queue.store.sql("fair/claim_settings"))
            if setting:
                await c.execute(setting)
            args = sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(t))
                                      for v, t in zip(values, types, strict=True))
            cur = await c.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                                          "EXECUTE claim ({})").format(args))
            row = await cur.fetchone()
        finally:
            await c.execute("ROLLBACK")
        assert row is not None
        return row[0]


def top_nodes_ms(plan: Any, n: int = 22) -> list[tuple[float, str]]:
    """The CTEs and the scans of a plan by their time (ms, over all their loops; a
    CTE's includes the CTEs it pulls rows from), largest first."""
    out: list[tuple[float, str]] = []

    def walk(node: dict[str, Any]) -> None:
        ms = (node.get("Actual Total Time") or 0) * (node.get("Actual Loops") or 1)
        if node.get("Subplan Name") or not node.get("Plans"):
            what = " ".join(str(node.get(k, "")) for k in
                            ("Node Type", "Index Name", "Relation Name", "CTE Name",
                             "Subplan Name") if node.get(k))
            buffers = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
            out.append((round(ms, 2), f"{what} (loops {node.get('Actual Loops')}, rows "
                                      f"{node.get('Actual Rows')}, buffers {buffers})"))
        for c in node.get("Plans", []):
            walk(c)

    walk(plan[0]["Plan"])
    return sorted(out, reverse=True)[:n]


def top_nodes(plan: Any, n: int = 12) -> list[tuple[int, str]]:
    """Plan nodes by the shared buffers they read themselves (their children's taken
    away), largest first."""
    out: list[tuple[int, str]] = []

    def walk(node: dict[str, Any]) -> int:
        total = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        children = sum(walk(c) for c in node.get("Plans", []))
        what = " ".join(str(node.get(k, "")) for k in
                        ("Node Type", "Index Name", "Relation Name", "CTE Name",
                         "Subplan Name") if node.get(k))
        out.append((total - children, f"{what} (loops {node.get('Actual Loops')}, "
                                      f"rows {node.get('Actual Rows')})"))
        return total

    walk(plan[0]["Plan"])
    return sorted(out, reverse=True)[:n]


async def main(url: str, seconds: float, pending: int = 100_000,
               groups: int = 2_000, by_ms: bool = False) -> None:
    await build(url, SCHEMA, pending=pending, groups=groups, done=pending // 5)
    rng = random.Random(11)
    async with (Queue(url, schema=SCHEMA) as queue,
                await psycopg.AsyncConnection.connect(url) as holder):
        async def churn(until: float) -> int:
            n = 0
            while time.monotonic() < until:
                jobs = await queue.claim("t", 100)
                if jobs:
                    await queue.complete_many(jobs)
                await queue.enqueue_many(_replacements(len(jobs) or 100, groups, rng))
                n += 1
            return n

        await churn(time.monotonic() + 10)
        before = await explain(queue)
        await holder.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        await holder.execute(sql.SQL("SELECT count(*) FROM {}.groups").format(
            sql.Identifier(SCHEMA)))
        cycles = await churn(time.monotonic() + seconds)
        pinned = await explain(queue)
        no_seq = await explain(queue, "SET LOCAL enable_seqscan = off")
        await holder.rollback()
    for label, plan in (("before the pin", before),
                        (f"after {seconds:.0f} s pinned ({cycles} churn cycles)", pinned),
                        ("the same, enable_seqscan off", no_seq)):
        root = plan[0]["Plan"]
        print(f"\n== {label}: {plan[0]['Execution Time']:.1f} ms, "
              f"{root['Shared Hit Blocks'] + root.get('Shared Read Blocks', 0)} buffers")
        for b, node in top_nodes_ms(plan) if by_ms else top_nodes(plan):
            print(f"{b:>8}  {node}")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--ms"]
    asyncio.run(main(os.environ.get("DATABASE_URL",
                                    "postgresql://postgres@127.0.0.1:5432/test"),
                     float(args[0]) if args else 60.0,
                     *(int(a) for a in args[1:3]), by_ms="--ms" in sys.argv[1:]))
