"""Claim latency against backlog size (issue 4, parts 1 and 5): rota's claim, the post's
literal query (tests/oracle.py's select, taking its rows) and an unfair FIFO SKIP LOCKED
claim, at 1k, 10k, 100k and 1M pending jobs over 10,000 groups and three plans with
200,000 done jobs in the served window; then 1M again with clutter the claim must not
read (200,000 jobs deferred a month, a paused group's 100,000 jobs, 10,000 stuck
running jobs).

Each claim of 25 is followed by completing its jobs and enqueueing as many new ones
(in other groups), so the backlog, the served counts and the running set stay those of
a live queue; only the claim is timed. The three take turns on the same data set. The
EXPLAIN (ANALYZE, BUFFERS) of rota's claim and of the literal query at the largest size
is saved beside the results."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from rota import Queue

from .scale import build, fifo_claim, literal_claim, literal_params

SCHEMA = "bench_claim"
SIZES = (1_000, 10_000, 100_000, 1_000_000)
REPS = 300  # rota and FIFO; the literal query gets fewer at large sizes (about 1 s each)


def literal_reps(pending: int) -> int:
    return {1_000: 300, 10_000: 200, 100_000: 40}.get(pending, 15)


async def _replace(queue: Queue, n: int, seq: list[int]) -> None:
    """Complete-and-replace: enqueue n new jobs spread over the groups."""
    items = []
    for _ in range(n):
        seq[0] += 1
        items.append({"type": "t", "payload": {}, "group_id": f"g{(seq[0] * 7919) % 10_000}"})
    if items:
        await queue.enqueue_many(items)


async def run_rota(queue: Queue, reps: int, seq: list[int]) -> list[float]:
    times = []
    for i in range(reps + 10):
        t = time.perf_counter()
        jobs = await queue.claim("t", 25)
        dt = (time.perf_counter() - t) * 1000
        if i >= 10:  # warm-up: pool connections, prepared plans
            times.append(dt)
        for j in jobs:
            await queue.complete(j)
        await _replace(queue, len(jobs), seq)
    await queue.run_upkeep()
    return times


async def run_sql(queue: Queue, conn: Any, statement: sql.Composed, params: dict[str, Any],
                  reps: int, seq: list[int]) -> list[float]:
    """A claim statement that returns ids; its jobs are then completed and replaced."""
    done = sql.SQL("UPDATE {}.jobs SET status = 'done', finished_at = now(), "
                   "locked_at = NULL, claim_token = NULL WHERE id = ANY(%s)").format(
                       sql.Identifier(queue.schema))
    times = []
    for i in range(reps + 3):
        t = time.perf_counter()
        cur = await conn.execute(statement, params)
        ids = [r[0] for r in await cur.fetchall()]
        dt = (time.perf_counter() - t) * 1000
        if i >= 3:
            times.append(dt)
        await conn.execute(done, [ids])
        await _replace(queue, len(ids), seq)
    return times


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def explain(queue: Queue, conn: Any) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of one rota claim as it runs (its generic plan, in its
    transaction's settings), and of the literal query, rolled back."""
    params = {"type": "t", "limit": 25, "candidates": 116, "run_id": None,
              "offset": queue.clock_offset, "stale_after": queue.stale_after,
              "served_window": queue.served_window, **queue.plans.claim_params(),
              "probe_groups": 58, "probe_per": 2}
    claim = queue.fair_claim.statement()
    prepared, names = claim.text, claim.names
    args = ", ".join(sql.Literal(params[n]).as_string(conn) for n in names)
    async with conn.transaction(force_rollback=True):
        await conn.execute(queue.sql("fair/claim_settings"))
        await conn.execute("PREPARE rota_claim AS " + prepared)
        cur = await conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE rota_claim({args})")
        rota_plan = "\n".join(r[0] for r in await cur.fetchall())
        await conn.execute("DEALLOCATE rota_claim")
    async with conn.transaction(force_rollback=True):
        cur = await conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS) ") + literal_claim(queue),
                                 literal_params(queue, "t", 25))
        literal_plan = "\n".join(r[0] for r in await cur.fetchall())
    return ("-- rota's claim of 25 at 1,000,000 pending jobs (generic plan, JIT off, as it "
            "runs)\n" + rota_plan + "\n\n-- the post's literal query, same data, default "
            "settings\n" + literal_plan + "\n")


# The clutter the claim must not read (issue 4): jobs deferred a month ahead, a paused
# group's jobs and stuck running jobs (attempts used up), on top of the largest backlog.
CLUTTER = {"deferred": 200_000, "paused_jobs": 100_000, "stale": 10_000}


async def measure_one(url: str, results: Path, pending: int, *, clutter: bool = False,
                      explain_to: str | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    await build(url, SCHEMA, pending=pending, **(CLUTTER if clutter else {}))
    print(f"built {pending:,} pending{' + clutter' if clutter else ''} in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    seq = [0]
    queue = Queue(url, schema=SCHEMA)
    async with queue, await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        if explain_to:
            (results / explain_to).write_text(await explain(queue, conn))
        rota = await run_rota(queue, REPS, seq)
        literal = await run_sql(queue, conn, literal_claim(queue),
                                literal_params(queue, "t", 25), literal_reps(pending), seq)
        fifo = await run_sql(queue, conn, fifo_claim(queue), {"type": "t", "limit": 25},
                             REPS, seq)
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(sql.SQL("SELECT count(*) AS n FROM {}.jobs WHERE status = "
                                  "'pending'").format(sql.Identifier(SCHEMA)))
        left = (await cur.fetchone() or {}).get("n")
    r: dict[str, Any] = {
        name: {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "n": len(xs),
               "mean": statistics.fmean(xs)}
        for name, xs in (("rota", rota), ("literal", literal), ("fifo", fifo))
    }
    r["pending_after"] = left
    return r


async def measure(url: str, sizes: tuple[int, ...], results: Path) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for pending in sizes:
        out[pending] = await measure_one(
            url, results, pending,
            explain_to="claim_explain_1m.txt" if pending == 1_000_000 else None)
        print(row(pending, out[pending]), flush=True)
    return out


async def measure_clutter(url: str, results: Path) -> dict[str, Any]:
    r = await measure_one(url, results, 1_000_000, clutter=True)
    print(row(1_000_000, r, " + clutter"), flush=True)
    return r


def header() -> str:
    return ("| pending | rota p50 | rota p99 | literal p50 | literal p99 | FIFO p50 | FIFO p99 "
            "| literal / rota (p50) | rota / FIFO (p50) |\n|---:|---:|---:|---:|---:|---:|---:"
            "|---:|---:|")


def row(pending: int, r: dict[str, Any], label: str = "") -> str:
    return (f"| {pending:,}{label} | {r['rota']['p50']:.2f} | {r['rota']['p99']:.2f} | "
            f"{r['literal']['p50']:.1f} | {r['literal']['p99']:.1f} | "
            f"{r['fifo']['p50']:.2f} | {r['fifo']['p99']:.2f} | "
            f"{r['literal']['p50'] / r['rota']['p50']:.0f}x | "
            f"{r['rota']['p50'] / r['fifo']['p50']:.1f}x |")


def plot(out: dict[int, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted(out)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, label in (("rota", "rota (fair, exact)"), ("literal", "post's literal query"),
                        ("fifo", "FIFO SKIP LOCKED (unfair)")):
        ax.plot(sizes, [out[s][name]["p50"] for s in sizes], marker="o", label=f"{label} p50")
        ax.plot(sizes, [out[s][name]["p99"] for s in sizes], marker="x", linestyle="--",
                label=f"{label} p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("pending jobs (10,000 groups, 200,000 done in window)")
    ax.set_ylabel("claim of 25, ms")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(url: str, results: Path, sizes: tuple[int, ...] = SIZES) -> dict[str, Any]:
    """Returns ``{"by_pending": {pending: figures}, "clutter": figures or None}``; the
    clutter case (1,000,000 pending plus CLUTTER) runs when 1,000,000 is among sizes."""
    results.mkdir(parents=True, exist_ok=True)
    print(header())
    out = asyncio.run(measure(url, sizes, results))
    plot(out, results / "claim_latency.png")
    clutter = (asyncio.run(measure_clutter(url, results)) if 1_000_000 in sizes else None)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    return {"by_pending": out, "clutter": clutter}
