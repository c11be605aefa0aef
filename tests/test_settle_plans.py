"""Batch settlements are driven by their list of jobs whatever the statistics say
(docs/design.md, "Batch plans"): each listed job is read by its primary key, one probe per
listed id, never through a partial index of running (or pending) jobs scanned whole with
the list rescanned for each of them, which went quadratic on statistics taken when few
jobs ran (1,000 jobs took 250 ms instead of 20)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from rota import Job, Queue

# After every test: the fair claim's bookkeeping keeps its contract (verify.sql).
pytestmark = pytest.mark.usefixtures("fair_exact")

PLACEHOLDER = re.compile(r"%\((\w+)\)[sb]")


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of an EXPLAIN (FORMAT JSON) plan, initplans and CTEs included."""
    found = [plan]
    for child in plan.get("Plans", []):
        found += nodes(child)
    return found


def jobs_reads(plan: dict[str, Any]) -> list[str]:
    """How the plan reads jobs: one entry per node naming the table, other than the
    update itself ("Index Scan jobs_pkey", "Seq Scan", ...)."""
    return [f"{n['Node Type']} {n.get('Index Name', '')}".strip() for n in nodes(plan)
            if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"]


def driven_by_the_list(plan: dict[str, Any]) -> None:
    """Every read of jobs is a probe of its primary key by the listed ids (an index
    condition on id), and no join filters rows (a list rescanned per job)."""
    reads = [n for n in nodes(plan)
             if n.get("Relation Name") == "jobs" and n["Node Type"] != "ModifyTable"]
    assert reads
    assert jobs_reads(plan) == ["Index Scan jobs_pkey"] * len(reads)
    for n in reads:
        assert n["Index Cond"].startswith("(id = ")
    assert [n["Node Type"] for n in nodes(plan) if "Join Filter" in n] == []
    assert [n["Node Type"] for n in nodes(plan)
            if n.get("Rows Removed by Join Filter")] == []


async def explain(queue: Queue, url: str, name: str, params: dict[str, Any], *,
                  generic: bool, analyze: bool = False) -> dict[str, Any]:
    """The plan of statement ``name`` as rota runs it, in a transaction rolled back: its
    custom plan (the values bound, as psycopg sends it until it prepares it), or its
    generic plan (what a prepared statement settles on: EXPLAIN EXECUTE with
    plan_cache_mode forced)."""
    options = sql.SQL("ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON")
    async with await psycopg.AsyncConnection.connect(url, prepare_threshold=None) as c:
        text = queue.store.sql(name).as_string(c)
        if generic:
            names: list[str] = []
            for m in PLACEHOLDER.finditer(text):
                if m.group(1) not in names:
                    names.append(m.group(1))
            dollars = PLACEHOLDER.sub(lambda m: f"${names.index(m.group(1)) + 1}", text)
            await c.execute(sql.SQL("PREPARE settle AS ") + sql.SQL(dollars))
            cur = await c.execute("SELECT parameter_types::text[] FROM pg_prepared_statements"
                                  " WHERE name = 'settle'")
            row = await cur.fetchone()
            assert row is not None
            await c.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            args = sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Literal(params[n]),
                                                               sql.SQL(t))
                                      for n, t in zip(names, row[0], strict=True))
            cur = await c.execute(sql.SQL("EXPLAIN ({}) EXECUTE settle ({})")
                                  .format(options, args))
        else:
            cur = await c.execute(sql.SQL("EXPLAIN ({}) ").format(options)
                                  + sql.SQL(text), params)
        [[plan]] = await cur.fetchall()
        await c.rollback()
    return plan[0]["Plan"]  # type: ignore[no-any-return]


async def claim(queue: Queue, n: int) -> list[Job]:
    jobs: list[Job] = []
    while len(jobs) < n and (got := await queue.claim("t", n - len(jobs))):
        jobs += got
    assert len(jobs) == n
    return sorted(jobs, key=lambda j: j.id)


def settle_params(queue: Queue, jobs: list[Job], extra: int = 0) -> dict[str, dict[str, Any]]:
    """Each changed statement's parameters for ``jobs`` (and ``extra`` ids no job has)."""
    top = max(j.id for j in jobs)
    ids = [j.id for j in jobs] + [top + 1 + i for i in range(extra)]
    tokens = [j.claim_token for j in jobs] + [uuid.uuid4() for _ in range(extra)]
    n = len(ids)
    when = datetime(2030, 1, 1, tzinfo=UTC)
    return {
        "complete_many": {"ids": ids, "claim_tokens": tokens, "results": ['{"r": 1}'] * n,
                          "started_ats": [when] * n, "costs": [None] * n,
                          "offset": timedelta(0), "schema_name": queue.schema},
        "heartbeat": {"ids": ids, "claim_tokens": tokens, "offset": timedelta(0)},
        "release": {"ids": ids, "claim_tokens": tokens, "not_before": None},
        "defer": {"ids": ids, "claim_tokens": tokens, "until": None,
                  "delay": timedelta(0), "max_deferrals": None, "offset": timedelta(0)},
        "claim_states": {"ids": ids, "claim_tokens": tokens},
        "restore_due": {"ids": ids, "claim_tokens": tokens, "pushed": [when] * n,
                        "asked": [None] * n, "offset": timedelta(0)},
    }


async def test_batch_settlements_probe_the_primary_key_on_stale_statistics(
    queue: Queue, aconn: Any, database_url: str
) -> None:
    """Statistics taken while no job ran say next to none run; with 2,000 running, every
    batch statement still reads jobs by key, for 1, 2,000 and 10,000 listed jobs, in its
    custom and its generic plan, and complete_many completes the 2,000 exactly."""
    await queue.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(3000)])
    await aconn.execute(sql.SQL("ANALYZE {}").format(queue.table("jobs")))
    running = await claim(queue, 2000)
    for name, params in settle_params(queue, running[:1]).items():
        for generic in (False, True):
            driven_by_the_list(await explain(queue, database_url, name, params,
                                             generic=generic))
    for name, params in settle_params(queue, running, extra=8000).items():
        for generic in (False, True):
            driven_by_the_list(await explain(queue, database_url, name, params,
                                             generic=generic))
    batch = settle_params(queue, running)["complete_many"]
    for generic in (False, True):
        driven_by_the_list(await explain(queue, database_url, "complete_many", batch,
                                         generic=generic, analyze=True))

    assert await queue.heartbeat(running) == 2000
    assert await queue.complete_many(running, results=[{"i": j.id} for j in running],
                                     costs=[2] * 2000) == [True] * 2000
    cur = await aconn.execute(sql.SQL(
        "SELECT id, status, claim_token, result, cost, started_at, locked_at FROM {}"
        " WHERE id = ANY(%s) ORDER BY id").format(queue.table("jobs")),
        [[j.id for j in running]])
    rows = await cur.fetchall()
    assert rows == [(j.id, "done", j.claim_token, {"i": j.id}, 2, j.locked_at, None)
                    for j in running]
    # Repeated under the same claims: already done by them (docs/design.md, "Settling
    # twice"), and nothing changes.
    assert await queue.complete_many(running) == [True] * 2000
    assert await queue.claim_states(running) == {j.id: "done" for j in running}
    cur = await aconn.execute(sql.SQL("SELECT status, count(*) FROM {} GROUP BY status"
                                      " ORDER BY status").format(queue.table("jobs")))
    assert await cur.fetchall() == [("done", 2000), ("pending", 1000)]
