"""Bulk-built scale data sets for the claim benchmarks (INSERT … SELECT generate_series,
never enqueue calls), and the three claims compared: rota's, the post's literal query
and an unfair FIFO SKIP LOCKED claim."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from rota import Queue
from rota.db import migrate

PLANS = ("free", "standard", "pro")

# The post's literal claim (tests/oracle.py's select, with its priority CASE), taking
# the rows it picks: what a claim costs when it sorts every eligible row.
LITERAL_CLAIM = """
WITH picked AS ({select})
UPDATE {schema}.jobs u
SET status = 'running', locked_at = now(), attempts = u.attempts + 1,
    claim_token = gen_random_uuid()
FROM picked p WHERE u.id = p.id
RETURNING u.id
"""

# Unfair FIFO: oldest ready pending jobs of the type, SKIP LOCKED on an index.
FIFO_INDEX = """
CREATE INDEX IF NOT EXISTS jobs_fifo_idx ON {schema}.jobs (type, created_at, id)
    WHERE status = 'pending'
"""
FIFO_CLAIM = """
WITH picked AS (
    SELECT id FROM {schema}.jobs
    WHERE type = %(type)s AND status = 'pending' AND run_after <= now()
    ORDER BY created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs u
SET status = 'running', locked_at = now(), attempts = u.attempts + 1,
    claim_token = gen_random_uuid()
FROM picked p WHERE u.id = p.id
RETURNING u.id
"""


# Jobs done inside the served window (add_jobs' columns): random groups, finished over
# the last 23 hours, so served counts differ.
DONE = {"group_id": "'g' || floor(random() * %(g)s)::int", "status": "'done'",
        "attempts": "1", "run_after": "now() - interval '1 day'",
        "created_at": "now() - interval '1 day'",
        "finished_at": "now() - random() * interval '23 hours'"}


async def create(c: psycopg.AsyncConnection[Any], schema: str, groups: int,
                 owners: int | None = None) -> None:
    """Create ``schema`` from scratch with ``groups`` active groups ``g0``… over the
    three plans, round robin, owned by ``o0``… (one owner a group, or ``owners`` owners
    round robin, each owner's groups on one plan when ``owners`` is a multiple of 3), and
    seed ``random()`` (the data sets are the same at each build)."""
    s = sql.Identifier(schema)
    await c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))
    await migrate(c, schema)
    await c.execute(sql.SQL(
        "INSERT INTO {s}.groups (group_id, owner_id, plan, active) "
        "SELECT 'g' || i, 'o' || (i %% %(owners)s), (%(plans)s::text[])[1 + i %% 3], true "
        "FROM generate_series(0, %(n)s - 1) i").format(s=s),
        {"plans": list(PLANS), "n": groups, "owners": owners or groups})
    await c.execute("SELECT setseed(0.42)")


async def add_jobs(c: psycopg.AsyncConnection[Any], s: sql.Identifier, n: int,
                   params: dict[str, Any], **columns: str) -> None:
    """Insert ``n`` jobs in one ``INSERT … SELECT … FROM generate_series(1, n) i``:
    ``columns`` maps a column to an SQL expression of ``i`` and of ``params`` (with
    ``%%`` and ``{{}}`` escaped). Unless given: type ``%(t)s``, groups round robin over
    ``%(g)s``, an empty payload, 3 attempts."""
    values = {"type": "%(t)s", "group_id": "'g' || (i %% %(g)s)", "payload": "'{{}}'",
              "max_attempts": "3", **columns}
    await c.execute(sql.SQL(
        f"INSERT INTO {{s}}.jobs ({', '.join(values)}) SELECT {', '.join(values.values())}"
        " FROM generate_series(1, %(n)s) i").format(s=s), {**params, "n": n})


async def fold_bulk_load(c: psycopg.AsyncConnection[Any], s: sql.Identifier,
                         job_type: str) -> None:
    """Keep the counts of jobs loaded straight into ``jobs`` as a running queue keeps
    them: the type's edge row, as its first completion makes it (jobs loaded as done
    made none), the edge moved to the window start (a day ago), and the counts folded."""
    await c.execute(sql.SQL(
        "INSERT INTO {s}.fair_edge (type, edge) VALUES (%(t)s, '-infinity')"
        " ON CONFLICT DO NOTHING").format(s=s), {"t": job_type})
    await c.execute(sql.SQL(
        "SELECT {s}.fair_advance(%(t)s, now() - interval '1 day'),"
        " {s}.fair_fold(%(t)s, now())").format(s=s), {"t": job_type})


async def finish(c: psycopg.AsyncConnection[Any], s: sql.Identifier, job_type: str) -> None:
    """Add the FIFO claim's index, move the served window's edge to now and fold the
    bulk load's counts, as a running queue keeps them; then compact what the bulk load
    churned and analyze."""
    await c.execute(sql.SQL(FIFO_INDEX).format(schema=s))
    await fold_bulk_load(c, s, job_type)
    await c.execute(sql.SQL("VACUUM FULL {}.fair_served").format(s))
    for t in ("jobs", "fair_groups", "fair_served", "groups"):
        await c.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(s, sql.Identifier(t)))


async def build(url: str, schema: str, *, pending: int, groups: int = 10_000,
                done: int = 200_000, deferred: int = 0, stale: int = 0,
                paused_jobs: int = 0, job_type: str = "t", owners: int | None = None) -> None:
    """Create ``schema`` from scratch with ``groups`` groups over three plans,
    ``pending`` ready jobs spread over them, ``done`` jobs finished inside the served
    window (random groups, so served counts differ), and optionally jobs deferred far
    ahead, stale running jobs and a paused group's jobs (which must not slow a claim)."""
    s = sql.Identifier(schema)
    params = {"t": job_type, "g": groups}
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await create(c, schema, groups, owners)
        # Pending: round-robin over groups, created over the last hour, ready now.
        await add_jobs(c, s, pending, params, run_after="now() - interval '1 hour'",
                       created_at="now() - interval '1 hour' + i * interval '1 millisecond'")
        await add_jobs(c, s, done, params, **DONE)
        if deferred:
            await add_jobs(c, s, deferred, params, run_after="now() + interval '30 days'",
                           created_at="now() - interval '2 hours'")
        if stale:
            await add_jobs(c, s, stale, params, status="'running'", attempts="3",
                           run_after="now() - interval '3 hours'",
                           created_at="now() - interval '3 hours'",
                           locked_at="now() - interval '2 hours'",
                           claim_token="gen_random_uuid()")
        if paused_jobs:
            await c.execute(sql.SQL(
                "INSERT INTO {s}.groups (group_id, plan, active) VALUES ('paused', 'pro', false)"
            ).format(s=s))
            await add_jobs(c, s, paused_jobs, params, group_id="'paused'",
                           run_after="now() - interval '2 hours'",
                           created_at="now() - interval '2 hours'")
        await finish(c, s, job_type)


def literal_claim(queue: Queue) -> sql.Composed:
    """The post's literal claim for ``queue`` (its select is tests/oracle.py's)."""
    from tests.oracle import ORACLE, ORDERS, plan_case

    select = sql.SQL(ORACLE).format(
        schema=sql.Identifier(queue.schema),
        now=sql.SQL("(now() + {}::interval)").format(sql.Literal(queue.clock_offset)),
        priority=plan_case(queue.plans, "priority"),
        weight=plan_case(queue.plans, "weight"),
        order=sql.SQL(ORDERS[queue.fair_by]),
    )
    return sql.SQL(LITERAL_CLAIM).format(select=select, schema=sql.Identifier(queue.schema))


def fifo_claim(queue: Queue, rows: bool = False) -> sql.Composed:
    """The FIFO reference claim on ``queue``'s jobs table; ``rows``: returning the
    claimed rows whole (what a worker needs), not only their ids."""
    assert FIFO_CLAIM.count("RETURNING u.id") == 1
    text = FIFO_CLAIM.replace("RETURNING u.id", "RETURNING u.*") if rows else FIFO_CLAIM
    return sql.SQL(text).format(schema=sql.Identifier(queue.schema))


def literal_params(queue: Queue, job_type: str, limit: int) -> dict[str, Any]:
    return {"type": job_type, "limit": limit, "served_window": queue.served_window,
            "stale_after": queue.stale_after}
