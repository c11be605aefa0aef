-- Fragment of claim.sql, put in place of its pool placeholder for fair_by "owner"
-- (docs/design.md, "The fair claim"): every group of the type with its exact served
-- count and its owner, read live from the groups relation (rota's table or the
-- application's), and each owner's served count, the sum over its groups on that plan.
-- The owner is the unit the order compares first: 'o:' || owner_id, or 'g:' || group_id
-- for a group without an owner (its own owner; a group missing from the relation has
-- none), or '-' for the group-less jobs. Exact; like claim_pool_scan.sql its cost grows
-- with the groups of the type (bench/RESULTS.md, section 16).
-- Needs:   CTEs clock, special, served_delta, edge_fix, running_old, stale_head (and
--          stale, through groupless_head.sql); parameter type.
-- Defines: CTEs owner_groups, owner_served, pool(group_id, head_lb, head_id, served_n,
--          served_lb, plan, active, unit, unit_served); includes claim_head.sql and
--          groupless_head.sql.
-- Every group with a row or a served count outside its row (special): an owner's served
-- count includes its paused groups and those with nothing pending.
owner_groups AS (
    SELECT a.group_id, fg.head_lb, fg.head_id, fg.head_until, fg.ready_lb,
           coalesce(fg.served_n, 0) + coalesce(dd.n, 0) + coalesce(ef.n, 0)
             - coalesce(ro.n, 0) AS served,
           g.plan, coalesce(g.active, true) AS active,
           CASE WHEN g.owner_id IS NULL THEN 'g:' || a.group_id
                ELSE 'o:' || g.owner_id END AS unit
    FROM (SELECT f.group_id FROM {schema}.fair_groups f WHERE f.type = %(type)s
          UNION
          SELECT s.group_id FROM special s) a
    LEFT JOIN {schema}.fair_groups fg ON fg.type = %(type)s AND fg.group_id = a.group_id
    LEFT JOIN {groups} g ON g.group_id = a.group_id
    LEFT JOIN served_delta dd ON dd.group_id = a.group_id
    LEFT JOIN edge_fix ef ON ef.group_id = a.group_id
    LEFT JOIN running_old ro ON ro.group_id = a.group_id
),
owner_served AS (
    SELECT og.*, sum(og.served) OVER (PARTITION BY og.plan, og.unit) AS unit_served
    FROM owner_groups og
),
-- The groups that may have a claimable job (a ready head, or a stale job), each with its
-- head: the smaller of its bound (none once expired) and its stale head.
pool AS (
    SELECT fg.group_id, hd.head AS head_lb, hd.head_id, fg.served AS served_n,
           fg.served AS served_lb, fg.plan, fg.active, fg.unit, fg.unit_served
    FROM owner_served fg
    CROSS JOIN clock c
    LEFT JOIN stale_head sh ON sh.group_id = fg.group_id
    {claim_head}
    WHERE fg.ready_lb <= c.now OR sh.head IS NOT NULL
    UNION ALL
    SELECT NULL, h.head, h.head_id, 0, 0, NULL, true, '-', 0
    FROM {groupless_head} h
)
