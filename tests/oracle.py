"""The naive fair claim query, kept as the oracle for rota's claim.

It is the naive fair query (the whole order as one ORDER BY over every eligible row),
on rota's table names, with the batch interleave of docs/design.md ("The fair claim"):
the second ORDER BY term is ``served + position`` instead of ``served``, divided by the
plan's weight; with ``fair_by="owner"`` the owner's served count plus the job's position
among its owner's jobs (by the rest of the key), divided by the weight, comes first. A
job counts its cost in the served counts, and a position counts in the type's expected
cost (docs/design.md, "Cost"). It reads only; the
test compares its first ``limit`` ids with what ``Queue.claim`` hands out.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from rota import Plans, Queue

ORACLE = """
WITH job_cost AS (  -- the type's expected cost: a position counts in it
    SELECT coalesce((SELECT expected FROM {schema}.fair_costs WHERE type = %(type)s), 1) AS e
),
served AS (
    SELECT group_id, sum(cost) AS n
    FROM {schema}.jobs
    WHERE type = %(type)s
      AND status IN ('done', 'running')
      AND coalesce(finished_at, locked_at) >= {now} - %(served_window)s::interval
    GROUP BY group_id
),
-- An owner's served count: the sum over its groups on one plan (every group, paused or
-- not); a group without an owner (or missing from the relation) is its own owner.
owners AS (
    SELECT groups.plan,
           CASE WHEN groups.owner_id IS NULL THEN 'g:' || served.group_id
                ELSE 'o:' || groups.owner_id END AS unit,
           sum(served.n) AS n
    FROM served
    LEFT JOIN {schema}.groups ON groups.group_id = served.group_id
    WHERE served.group_id IS NOT NULL
    GROUP BY 1, 2
),
eligible AS (
    SELECT jobs.id, jobs.group_id, jobs.created_at,
           {priority} AS priority,
           {weight} AS weight,
           coalesce(served.n, 0) AS served,
           groups.plan,
           CASE WHEN jobs.group_id IS NULL THEN '-'
                WHEN groups.owner_id IS NULL THEN 'g:' || jobs.group_id
                ELSE 'o:' || groups.owner_id END AS unit
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
),
by_group AS (
    SELECT e.*,
           e.served + (row_number() OVER (PARTITION BY e.group_id
                                          ORDER BY e.created_at, e.id) - 1) * c.e AS fair
    FROM eligible e CROSS JOIN job_cost c
),
by_owner AS (
    SELECT g.*,
           coalesce(o.n, 0) + (row_number() OVER (PARTITION BY g.plan, g.unit
                                                  ORDER BY g.fair, g.created_at, g.id) - 1)
                              * c.e AS owner_fair
    FROM by_group g CROSS JOIN job_cost c
    LEFT JOIN owners o ON o.plan IS NOT DISTINCT FROM g.plan AND o.unit = g.unit
)
SELECT id, plan, unit, group_id FROM by_owner
ORDER BY {order}
LIMIT %(limit)s
"""

#: Each capped owner's running jobs whose lock is fresh, every type (docs/design.md,
#: "Caps"): (plan, unit, running).
RUNNING = """
SELECT g.plan, CASE WHEN g.owner_id IS NULL THEN 'g:' || g.group_id
                    ELSE 'o:' || g.owner_id END AS unit, count(*)
FROM {schema}.jobs j
JOIN {schema}.groups g ON g.group_id = j.group_id
WHERE j.status = 'running' AND j.locked_at >= {now} - %(stale_after)s::interval
GROUP BY 1, 2
"""

#: Each capped group of rota's own groups table (groups.max_running): its cap and its
#: running jobs whose lock is fresh, every type (docs/design.md, "Caps").
GROUP_RUNNING = """
SELECT g.group_id, g.max_running,
       (SELECT count(*) FROM {schema}.jobs j
        WHERE j.group_id = g.group_id AND j.status = 'running'
          AND j.locked_at >= {now} - %(stale_after)s::interval)
FROM {schema}.groups g
WHERE g.max_running IS NOT NULL
"""

#: The ORDER BY of each fair_by (docs/design.md, "The fair claim"): the served counts
#: and positions divided by the plan's weight, as numerics, the claim's own arithmetic.
ORDERS = {
    "group": "priority DESC, fair::numeric / weight, created_at, id",
    "owner": "priority DESC, owner_fair::numeric / weight, fair, created_at, id",
}


def plan_case(plans: Plans, attribute: str) -> sql.Composable:
    """The post's generated CASE for a plan's ``priority`` or ``weight``: no owner -> the
    middle plan's, each plan its own, anything else the lowest plan's. Plan ids go in as
    literals, quoted by psycopg."""
    whens = [
        sql.SQL("WHEN groups.plan = {} THEN {}").format(
            sql.Literal(p.id), sql.Literal(getattr(p, attribute)))
        for p in plans
    ]
    return sql.SQL("CASE WHEN groups.plan IS NULL THEN {} {} ELSE {} END").format(
        sql.Literal(getattr(plans.middle, attribute)), sql.SQL(" ").join(whens),
        sql.Literal(getattr(plans.lowest, attribute)),
    )


def priority_case(plans: Plans) -> sql.Composable:
    """The priority CASE (:func:`plan_case`)."""
    return plan_case(plans, "priority")


async def oracle_ids(queue: Queue, conn: Any, type_: str, limit: int) -> list[int]:
    """The first ``limit`` job ids of ``type_`` in the queue's fair order (its plans,
    clock, windows and ``fair_by``), by the naive query. With plans that cap their
    owners (``Plan.max_running``), or groups of rota's own groups table capped
    (``groups.max_running``, whatever the plans), the order is walked and a job passed
    over while its owner, or its group, has as many running (fresh locks, every type)
    and taken so far as its cap (docs/design.md, "Caps")."""
    now = sql.SQL("(now() + {}::interval)").format(sql.Literal(queue.clock_offset))
    query = sql.SQL(ORACLE).format(
        schema=sql.Identifier(queue.schema), now=now,
        priority=priority_case(queue.plans),
        weight=plan_case(queue.plans, "weight"),
        order=sql.SQL(ORDERS[queue.fair_by]),
    )
    cur = await conn.execute(sql.SQL(GROUP_RUNNING).format(
        schema=sql.Identifier(queue.schema), now=now), {"stale_after": queue.stale_after})
    group_caps = {gid: (cap, n) for gid, cap, n in await cur.fetchall()}
    capped = queue.plans.capped or bool(group_caps)
    cur = await conn.execute(query, {
        "type": type_, "limit": None if capped else limit,
        "served_window": queue.served_window, "stale_after": queue.stale_after,
    })
    rows = await cur.fetchall()
    if not capped:
        return [r[0] for r in rows]
    cur = await conn.execute(sql.SQL(RUNNING).format(schema=sql.Identifier(queue.schema),
                                                     now=now),
                             {"stale_after": queue.stale_after})
    running = {(plan, unit): n for plan, unit, n in await cur.fetchall()}
    caps = {p.id: p.max_running for p in queue.plans if p.max_running is not None}
    group_running = {gid: n for gid, (_, n) in group_caps.items()}
    taken: list[int] = []
    for job_id, plan, unit, group_id in rows:
        if plan in caps and running.get((plan, unit), 0) >= caps[plan]:
            continue
        if group_id in group_caps and group_running[group_id] >= group_caps[group_id][0]:
            continue
        if plan in caps:
            running[plan, unit] = running.get((plan, unit), 0) + 1
        if group_id in group_caps:
            group_running[group_id] += 1
        taken.append(job_id)
        if len(taken) == limit:
            break
    return taken


async def insert_rows(conn: Any, schema: str, groups: list[tuple[Any, ...]],
                      jobs: list[dict[str, Any]], now: sql.Composable) -> None:
    """Insert a property test's generated groups (``g0``…, each ``(plan, active)``,
    ``(plan, active, owner_id)`` or ``(plan, active, owner_id, max_running)``) and jobs,
    with times as offsets in seconds from ``now`` (an SQL expression: the queue's
    clock). A running job holds the slot its ``slot`` says (docs/fast-claim.md, "Caps"):
    ``"claimed"`` (the default) its group's plan and owner, as a capped claim writes
    them; ``"none"`` no slot, as the uncapped claim leaves it; ``"moved"`` another
    owner's of the same plan (o0's, or o1's for o0's group), as after its group moved:
    the claim must be exact with each."""
    s = sql.Identifier(schema)
    for i, (plan, active, *rest) in enumerate(groups):  # (plan, active[, owner[, cap]])
        owner, cap = (*rest, None, None)[:2]
        await conn.execute(
            sql.SQL("INSERT INTO {}.groups (group_id, plan, active, owner_id, max_running)"
                    " VALUES (%s, %s, %s, %s, %s)")
            .format(s), [f"g{i}", plan, active, owner, cap])
    for j in jobs:
        running, done = j["status"] == "running", j["status"] in ("done", "failed")
        await conn.execute(sql.SQL(
            "INSERT INTO {s}.jobs (type, group_id, payload, status, attempts, max_attempts,"
            " run_after, locked_at, created_at, finished_at, claim_token, cost, slot_plan,"
            " slot_owner) SELECT"
            " %(type)s, %(group)s, '{{}}', %(status)s, %(attempts)s, 3,"
            " {now} + make_interval(secs => %(run_after)s),"
            " CASE WHEN %(running)s THEN {now} + make_interval(secs => %(locked)s) END,"
            " {now} + make_interval(secs => %(created)s),"
            " CASE WHEN %(done)s THEN {now} + make_interval(secs => %(finished)s) END,"
            " CASE WHEN %(running)s THEN gen_random_uuid() END, %(cost)s::numeric,"
            " CASE WHEN %(running)s AND %(slot)s <> 'none' THEN g.plan END,"
            " CASE WHEN NOT %(running)s OR %(slot)s = 'none' OR g.plan IS NULL THEN NULL"
            "      WHEN %(slot)s = 'moved' THEN CASE WHEN g.owner_id = 'o0' THEN 'o:o1'"
            "                                          ELSE 'o:o0' END"
            "      WHEN g.owner_id IS NULL THEN 'g:' || g.group_id ELSE 'o:' || g.owner_id END"
            " FROM (SELECT 1) one LEFT JOIN {s}.groups g ON g.group_id = %(group)s"
        ).format(s=s, now=now), {
            **j, "running": running, "done": done, "cost": j.get("cost", "1"),
            "slot": j.get("slot", "claimed"),
            "group": None if j["group"] is None else f"g{j['group']}",
            "attempts": j["attempts"] if j["status"] != "pending" else min(j["attempts"], 2),
        })
