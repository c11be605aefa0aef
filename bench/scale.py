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


async def build(url: str, schema: str, *, pending: int, groups: int = 10_000,
                done: int = 200_000, deferred: int = 0, stale: int = 0,
                paused_jobs: int = 0, job_type: str = "t") -> None:
    """Create ``schema`` from scratch with ``groups`` groups over three plans,
    ``pending`` ready jobs spread over them, ``done`` jobs finished inside the served
    window (random groups, so served counts differ), and optionally jobs deferred far
    ahead, stale running jobs and a paused group's jobs (which must not slow a claim)."""
    s = sql.Identifier(schema)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
        await c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(s))
        await migrate(c, schema)
        await c.execute(sql.SQL(
            "INSERT INTO {s}.groups (group_id, owner_id, plan, active) "
            "SELECT 'g' || i, 'o' || i, (%(plans)s::text[])[1 + i %% 3], true "
            "FROM generate_series(0, %(n)s - 1) i").format(s=s),
            {"plans": list(PLANS), "n": groups})
        await c.execute(sql.SQL("SELECT setseed(0.42)"))
        # Pending: round-robin over groups, created over the last hour, ready now.
        await c.execute(sql.SQL(
            "INSERT INTO {s}.jobs (type, group_id, payload, max_attempts, run_after,"
            " created_at) "
            "SELECT %(t)s, 'g' || (i %% %(g)s), '{{}}', 3, now() - interval '1 hour',"
            " now() - interval '1 hour' + i * interval '1 millisecond' "
            "FROM generate_series(1, %(n)s) i").format(s=s),
            {"t": job_type, "g": groups, "n": pending})
        # Done inside the window: random groups, finished over the last 23 hours.
        await c.execute(sql.SQL(
            "INSERT INTO {s}.jobs (type, group_id, payload, status, attempts, max_attempts,"
            " run_after, created_at, finished_at) "
            "SELECT %(t)s, 'g' || floor(random() * %(g)s)::int, '{{}}', 'done', 1, 3,"
            " now() - interval '1 day', now() - interval '1 day',"
            " now() - random() * interval '23 hours' "
            "FROM generate_series(1, %(n)s) i").format(s=s),
            {"t": job_type, "g": groups, "n": done})
        if deferred:
            await c.execute(sql.SQL(
                "INSERT INTO {s}.jobs (type, group_id, payload, max_attempts, run_after,"
                " created_at) "
                "SELECT %(t)s, 'g' || (i %% %(g)s), '{{}}', 3, now() + interval '30 days',"
                " now() - interval '2 hours' "
                "FROM generate_series(1, %(n)s) i").format(s=s),
                {"t": job_type, "g": groups, "n": deferred})
        if stale:
            await c.execute(sql.SQL(
                "INSERT INTO {s}.jobs (type, group_id, payload, status, attempts,"
                " max_attempts, run_after, created_at, locked_at, claim_token) "
                "SELECT %(t)s, 'g' || (i %% %(g)s), '{{}}', 'running', 3, 3,"
                " now() - interval '3 hours', now() - interval '3 hours',"
                " now() - interval '2 hours', gen_random_uuid() "
                "FROM generate_series(1, %(n)s) i").format(s=s),
                {"t": job_type, "g": groups, "n": stale})
        if paused_jobs:
            await c.execute(sql.SQL(
                "INSERT INTO {s}.groups (group_id, plan, active) VALUES ('paused', 'pro', false)"
            ).format(s=s))
            await c.execute(sql.SQL(
                "INSERT INTO {s}.jobs (type, group_id, payload, max_attempts, run_after,"
                " created_at) "
                "SELECT %(t)s, 'paused', '{{}}', 3, now() - interval '2 hours',"
                " now() - interval '2 hours' "
                "FROM generate_series(1, %(n)s) i").format(s=s),
                {"t": job_type, "n": paused_jobs})
        await c.execute(sql.SQL(FIFO_INDEX).format(schema=s))
        # Move the served window's edge to now and fold the bulk load's counts, as a
        # running queue keeps them; then compact what the bulk load churned.
        await c.execute(sql.SQL(
            "SELECT {s}.fair_advance(%(t)s, now() - interval '1 day'),"
            " {s}.fair_fold(%(t)s, now())").format(s=s), {"t": job_type})
        await c.execute(sql.SQL("VACUUM FULL {}.fair_served").format(s))
        await c.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(s))
        for t in ("fair_groups", "fair_served", "groups"):
            await c.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(s, sql.Identifier(t)))


def literal_claim(queue: Queue) -> sql.Composed:
    """The post's literal claim for ``queue`` (its select is tests/oracle.py's)."""
    from tests.oracle import ORACLE, priority_case

    select = sql.SQL(ORACLE).format(
        schema=sql.Identifier(queue.schema),
        now=sql.SQL("(now() + {}::interval)").format(sql.Literal(queue.clock_offset)),
        priority=priority_case(queue.plans),
    )
    return sql.SQL(LITERAL_CLAIM).format(select=select, schema=sql.Identifier(queue.schema))


def fifo_claim(queue: Queue) -> sql.Composed:
    return sql.SQL(FIFO_CLAIM).format(schema=sql.Identifier(queue.schema))


def literal_params(queue: Queue, job_type: str, limit: int) -> dict[str, Any]:
    return {"type": job_type, "limit": limit, "served_window": queue.served_window,
            "stale_after": queue.stale_after}
