"""The naive fair claim query, kept as the oracle for rota's claim.

It is the naive fair query (the whole order as one ORDER BY over every eligible row),
on rota's table names, with the batch interleave of docs/design.md ("The fair claim"):
the second ORDER BY term is ``served + position`` instead of ``served``. It reads only;
the test compares its first ``limit`` ids with what ``Queue.claim`` hands out.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from rota import Plans, Queue

ORACLE = """
WITH served AS (
    SELECT group_id, count(*)::int AS n
    FROM {schema}.jobs
    WHERE type = %(type)s
      AND status IN ('done', 'running')
      AND coalesce(finished_at, locked_at) >= {now} - %(served_window)s::interval
    GROUP BY group_id
),
eligible AS (
    SELECT jobs.id, jobs.group_id, jobs.created_at,
           {priority} AS priority,
           coalesce(served.n, 0) AS served
    FROM {schema}.jobs
    LEFT JOIN {schema}.groups ON groups.group_id = jobs.group_id
    LEFT JOIN served ON served.group_id = jobs.group_id
    WHERE jobs.type = %(type)s
      AND jobs.run_after <= {now}
      AND (jobs.status = 'pending'
           OR (jobs.status = 'running'
               AND jobs.locked_at < {now} - %(stale_after)s::interval
               AND jobs.attempts < jobs.max_attempts))
      AND (jobs.group_id IS NULL OR groups.active OR groups.group_id IS NULL)
)
SELECT id FROM eligible
ORDER BY priority DESC,
         served + (row_number() OVER (PARTITION BY group_id ORDER BY created_at, id) - 1),
         created_at, id
LIMIT %(limit)s
"""


def priority_case(plans: Plans) -> sql.Composable:
    """The post's generated CASE: no owner -> the middle plan, each plan its priority,
    anything else the lowest. Plan ids go in as literals, quoted by psycopg."""
    whens = [
        sql.SQL("WHEN groups.plan = {} THEN {}").format(sql.Literal(p.id), sql.Literal(p.priority))
        for p in plans
    ]
    return sql.SQL("CASE WHEN groups.plan IS NULL THEN {} {} ELSE {} END").format(
        sql.Literal(plans.middle.priority), sql.SQL(" ").join(whens),
        sql.Literal(plans.lowest.priority),
    )


async def oracle_ids(queue: Queue, conn: Any, type_: str, limit: int) -> list[int]:
    query = sql.SQL(ORACLE).format(
        schema=sql.Identifier(queue.schema),
        now=sql.SQL("(now() + {}::interval)").format(sql.Literal(queue.clock_offset)),
        priority=priority_case(queue.plans),
    )
    cur = await conn.execute(query, {
        "type": type_, "limit": limit, "served_window": queue.served_window,
        "stale_after": queue.stale_after,
    })
    return [r[0] for r in await cur.fetchall()]


async def insert_rows(conn: Any, schema: str, groups: list[tuple[Any, bool]],
                      jobs: list[dict[str, Any]], now: sql.Composable) -> None:
    """Insert a property test's generated groups (``g0``…) and jobs, with times as offsets
    in seconds from ``now`` (an SQL expression: the queue's clock)."""
    s = sql.Identifier(schema)
    for i, (plan, active) in enumerate(groups):
        await conn.execute(
            sql.SQL("INSERT INTO {}.groups (group_id, plan, active) VALUES (%s, %s, %s)")
            .format(s), [f"g{i}", plan, active])
    for j in jobs:
        running, done = j["status"] == "running", j["status"] in ("done", "failed")
        await conn.execute(sql.SQL(
            "INSERT INTO {s}.jobs (type, group_id, payload, status, attempts, max_attempts,"
            " run_after, locked_at, created_at, finished_at, claim_token) VALUES"
            " (%(type)s, %(group)s, '{{}}', %(status)s, %(attempts)s, 3,"
            " {now} + make_interval(secs => %(run_after)s),"
            " CASE WHEN %(running)s THEN {now} + make_interval(secs => %(locked)s) END,"
            " {now} + make_interval(secs => %(created)s),"
            " CASE WHEN %(done)s THEN {now} + make_interval(secs => %(finished)s) END,"
            " CASE WHEN %(running)s THEN gen_random_uuid() END)"
        ).format(s=s, now=now), {
            **j, "running": running, "done": done,
            "group": None if j["group"] is None else f"g{j['group']}",
            "attempts": j["attempts"] if j["status"] != "pending" else min(j["attempts"], 2),
        })
