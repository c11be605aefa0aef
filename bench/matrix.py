"""The workload matrix: the fair claim of 25 against an unfair FIFO SKIP LOCKED claim
measured in the same cell, on the workloads a new user builds, not only the one
claim_latency.py builds.

Each data set: ``pending`` ready jobs over 10,000 groups with 200,000 done jobs in the
served window (bench/scale.py's shape), written the way a loader writes them:

- **batch**: as ``enqueue_many`` in calls of 10,000 writes them: every job of a call
  shares one ``created_at`` (one statement, one ``now()``), ids in call order;
- **single**: one job per statement: every job its own ``created_at``.

(Written with ``INSERT … SELECT`` for speed: the claim only sees the rows, and the rows
are those the loaders write.) Groups are **uniform** (round robin) or **skewed** (10
groups hold 90 % of the jobs, the rest share 10 %).

Per data set, cells vary how each claimed batch is settled (complete; complete and
enqueue as many; defer to now; fail with the retry due now; a mix of the four), the
plans (1: every group on one plan; 3: free/standard/pro), and the claimers (1, or 4
concurrent processes). In every cell rota and FIFO take turns in rounds of 25 claims on
the same data, each settling its claims the same way; only the claim is timed.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

from rota import Queue

from .scale import DONE, PLANS, add_jobs, create, fifo_claim, finish

SCHEMA = "bench_matrix"
GROUPS = 10_000
SETTLES = ("complete", "complete+enqueue", "defer", "fail", "mix")
LIMIT = 25


async def build(url: str, *, pending: int, load: str, skew: bool) -> None:
    """The data set of one (load, groups) pair, from scratch, compacted and analyzed."""
    s = sql.Identifier(SCHEMA)
    # Group of the i-th job: round robin, or 90 % of jobs in the first 10 groups.
    group = ("CASE WHEN i %% 10 < 9 THEN 'g' || (i %% 10) "
             "ELSE 'g' || (10 + (i / 10) %% (%(g)s - 10)) END" if skew
             else "'g' || (i %% %(g)s)")
    # One created_at per 10,000 jobs (enqueue_many), or one per job.
    created = ("now() - interval '1 hour' + (i / 10000) * interval '1 second'"
               if load == "batch" else
               "now() - interval '1 hour' + i * interval '1 microsecond'")
    params = {"t": "t", "g": GROUPS}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await create(c, SCHEMA, GROUPS)
        await add_jobs(c, s, pending, params, group_id=group, max_attempts="1000",
                       run_after="now() - interval '1 hour'", created_at=created)
        await add_jobs(c, s, 200_000, params, **DONE)
        await finish(c, s, "t")


# 1 plan: every group on 'standard'; 3: free/standard/pro round robin (as create sets
# them). fair_groups' copy is set by hand, as the groups trigger would set it.
SET_PLANS = """
ALTER TABLE {s}.groups DISABLE TRIGGER groups_fair_changed;
UPDATE {s}.groups SET plan = CASE WHEN {n} = 1 THEN 'standard'
    ELSE ({plans}::text[])[1 + substr(group_id, 2)::int % 3] END;
UPDATE {s}.fair_groups f SET plan = g.plan FROM {s}.groups g
    WHERE g.group_id = f.group_id AND f.plan IS DISTINCT FROM g.plan;
INSERT INTO {s}.fair_plans (type, plan) SELECT DISTINCT 't', plan
    FROM {s}.groups WHERE plan IS NOT NULL ON CONFLICT DO NOTHING;
ALTER TABLE {s}.groups ENABLE TRIGGER groups_fair_changed
"""


async def set_plans(url: str, plans: int) -> None:
    """1 plan: every group on 'standard'; 3: free/standard/pro round robin. fair_groups'
    copy is set in the same transaction, as the groups trigger would set it (its per-row
    update of fair_groups made a 10,000-group plan change take minutes)."""
    s = sql.Identifier(SCHEMA)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        async with c.transaction():
            await c.execute(sql.SQL(SET_PLANS).format(
                s=s, n=sql.Literal(plans), plans=sql.Literal(list(PLANS))))
        await c.execute(sql.SQL("VACUUM ANALYZE {}.fair_groups").format(s))


# Settling a claimed batch, the same statements for both claims (by id: the FIFO claim
# is not fenced by rota's claim tokens). "fail": back to pending, due now, attempt kept.
SETTLE_SQL = {
    "complete": "UPDATE {s}.jobs SET status = 'done', finished_at = now(), locked_at = NULL,"
                " claim_token = NULL WHERE id = ANY(%(ids)s)",
    "defer": "UPDATE {s}.jobs SET status = 'pending', run_after = now(), locked_at = NULL,"
             " claim_token = NULL, attempts = greatest(attempts - 1, 0),"
             " deferrals = deferrals + 1 WHERE id = ANY(%(ids)s)",
    "fail": "UPDATE {s}.jobs SET status = 'pending', run_after = now(), locked_at = NULL,"
            " claim_token = NULL, last_error = 'boom' WHERE id = ANY(%(ids)s)",
    "enqueue": "INSERT INTO {s}.jobs (type, group_id, payload, max_attempts, run_after,"
               " created_at) SELECT 't', g, '{{}}', 1000, now(), now()"
               " FROM unnest(%(groups)s::text[]) g",
}


async def settle(conn: Any, how: str, ids: list[int], groups: list[str],
                 rng: random.Random) -> None:
    s = sql.Identifier(SCHEMA)
    if how == "mix":
        parts: dict[str, list[tuple[int, str]]] = {}
        for pair in zip(ids, groups, strict=True):
            parts.setdefault(rng.choice(SETTLES[:-1]), []).append(pair)
        for k, part in parts.items():
            await settle(conn, k, [i for i, _ in part], [g for _, g in part], rng)
        return
    base = "complete" if how == "complete+enqueue" else how
    await conn.execute(sql.SQL(SETTLE_SQL[base]).format(s=s), {"ids": ids})
    if how == "complete+enqueue":
        await conn.execute(sql.SQL(SETTLE_SQL["enqueue"]).format(s=s), {"groups": groups})


async def run_claims(url: str, how: str, rounds: int, per_round: int,
                     seed: int) -> dict[str, list[float]]:
    """rota and FIFO take turns, ``per_round`` claims each per round; returns the
    claim times (ms) of each after a warm-up."""
    rng = random.Random(seed)
    out: dict[str, list[float]] = {"rota": [], "fifo": []}
    queue = Queue(url, schema=SCHEMA)
    async with queue, await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        fifo = fifo_claim(queue).as_string(c).replace("RETURNING u.id",
                                                      "RETURNING u.id, u.group_id")
        for r in range(rounds + 1):
            for name in ("rota", "fifo"):
                for _ in range(per_round):
                    t = time.perf_counter()
                    if name == "rota":
                        jobs = await queue.claim("t", LIMIT)
                        got = [(j.id, j.group_id or "") for j in jobs]
                    else:
                        cur = await c.execute(fifo, {"type": "t", "limit": LIMIT})
                        got = [(i, g or "") for i, g in await cur.fetchall()]
                    dt = (time.perf_counter() - t) * 1000
                    if r > 0:  # round 0 warms connections and prepared plans
                        out[name].append(dt)
                    await settle(c, how, [i for i, _ in got], [g for _, g in got], rng)
        await queue.run_upkeep()
    return out


def _worker(url: str, how: str, rounds: int, per_round: int, seed: int,
            q: Any) -> None:
    q.put(asyncio.run(run_claims(url, how, rounds, per_round, seed)))


def run_concurrent(url: str, how: str, claimers: int, rounds: int,
                   per_round: int) -> dict[str, list[float]]:
    """``claimers`` processes, each running :func:`run_claims`; all their times."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, how, rounds, per_round, k, q))
             for k in range(claimers)]
    for p in procs:
        p.start()
    results = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return {n: [x for r in results for x in r[n]] for n in ("rota", "fifo")}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def summarize(times: dict[str, list[float]]) -> dict[str, float]:
    r, f = times["rota"], times["fifo"]
    return {"rota_p50": pct(r, 0.5), "rota_p99": pct(r, 0.99), "fifo_p50": pct(f, 0.5),
            "fifo_p99": pct(f, 0.99), "ratio_p50": pct(r, 0.5) / pct(f, 0.5),
            "n": len(r), "rota_mean": statistics.fmean(r) if r else float("nan")}


def cells(quick: bool) -> list[tuple[str, int, int]]:
    """(settle, plans, claimers) per data set: every settle with 1 and 3 plans and one
    claimer; 4 claimers for complete+enqueue and mix with 3 plans."""
    out = [(how, plans, 1) for how in SETTLES for plans in (1, 3)]
    out += [("complete+enqueue", 3, 4), ("mix", 3, 4)]
    return out


def main(url: str, *, pending: int = 1_000_000, quick: bool = False) -> list[dict[str, Any]]:
    """Every cell; returns one dict per cell (also printed as a table row)."""
    rounds, per_round = (3, 20) if quick else (4, 25)
    rows: list[dict[str, Any]] = []
    print(header())
    for load in ("batch", "single"):
        for skew in (False, True):
            t0 = time.perf_counter()
            asyncio.run(build(url, pending=pending, load=load, skew=skew))
            print(f"built {pending:,} pending ({load}, {'skewed' if skew else 'uniform'}) in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            plans_now = 3
            for how, plans, claimers in cells(quick):
                if plans != plans_now:
                    asyncio.run(set_plans(url, plans))
                    plans_now = plans
                if claimers == 1:
                    times = asyncio.run(run_claims(url, how, rounds, per_round, 0))
                else:
                    times = run_concurrent(url, how, claimers, rounds, per_round // 2)
                cell = {"pending": pending, "load": load,
                        "groups": "skewed" if skew else "uniform", "settle": how,
                        "plans": plans, "claimers": claimers, **summarize(times)}
                rows.append(cell)
                print(row(cell), flush=True)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    return rows


def header() -> str:
    return ("| load | groups | settle | plans | claimers | rota p50 | rota p99 | FIFO p50 "
            "| FIFO p99 | rota / FIFO (p50) |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|")


def row(c: dict[str, Any]) -> str:
    return (f"| {c['load']} | {c['groups']} | {c['settle']} | {c['plans']} | {c['claimers']} "
            f"| {c['rota_p50']:.2f} | {c['rota_p99']:.2f} | {c['fifo_p50']:.2f} "
            f"| {c['fifo_p99']:.2f} | {c['ratio_p50']:.1f}x |")


if __name__ == "__main__":
    import os
    import sys

    from . import server

    url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    print(server.describe(url))
    main(url, pending=100_000 if "--quick" in sys.argv else 1_000_000, quick="--quick" in sys.argv)
