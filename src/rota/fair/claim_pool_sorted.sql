-- Fragment of claim.sql, put in place of its pool placeholder, while a long transaction
-- holds the xmin horizon (ClaimUpkeep.horizon_held; docs/operations.md, "Long
-- transactions"): the group pool of claim_pool_cached.sql, its walk made one pass over
-- fair_groups. Every fold rewrites the folded groups' rows, and while the horizon is held
-- none of the old versions can go: their walk-index entries pile up at the front of the
-- walk (the groups' old, smaller served counts), where the index walk reads each one and
-- visits its row, and a seq scan per plan reads every page once per plan. This pass reads
-- each page once, gathers each plan's groups into arrays (`sorted_plans`, one row per
-- plan present) and keeps a plan's first groups by a bounded (top-N) sort of its own
-- arrays: no sort of every group (which at 10,000 groups cost more than the read), and
-- no rereading of the groups per plan (which grows with the plans). Its cost is a read
-- of the type's groups and a pass over their arrays, whatever the plans
-- (bench/RESULTS.md, section 14); the index walk avoids it when the horizon moves.
-- The special groups' rows come from the same read (special_group_row_read.sql, which
-- FairClaim.statement passes as claim_pool_special.sql's special_group_row).
-- Needs:   CTEs clock, special, served_delta, edge_fix, running_old, stale_head (and
--          stale, through groupless_head.sql); parameters type, probe_groups.
-- Defines: CTEs group_rows, sorted_plans, pool(group_id, head_lb, head_id, served_n,
--          served_lb, plan, active); includes claim_pool_special.sql.
-- The one read of the type's rows (their live versions), for the walk and the special
-- groups.
group_rows AS MATERIALIZED (
    SELECT f.group_id, f.plan, f.active, f.served_n, f.head_lb, f.head_id, f.head_until,
           f.ready_lb, f.plan_key, f.unit  -- the owner, for cap_filter_group_on.sql
    FROM {schema}.fair_groups f
    WHERE f.type = %(type)s
),
-- The same groups as the index walk: per plan present (group-less plan included), the
-- first probe_groups + 1 active groups with a valid head, ready now and not special, by
-- (served_n, head_lb, head_id). A plan's arrays keep its rows' order, element by element.
sorted_plans AS (
    SELECT f.plan, array_agg(f.group_id) AS group_ids, array_agg(f.served_n) AS served,
           array_agg(f.head_lb) AS head_lbs, array_agg(f.head_id) AS head_ids
    FROM group_rows f, clock c
    WHERE f.active AND f.head_lb < 'infinity' AND f.ready_lb <= c.now
      AND f.head_until > c.now
      AND f.group_id NOT IN (SELECT s.group_id FROM special s)
{cap_filter_group}
    GROUP BY f.plan
),
pool AS (
    SELECT f.group_id, f.head_lb, f.head_id, f.served_n, f.served_n AS served_lb, p.plan,
           true AS active
    FROM sorted_plans p
    CROSS JOIN LATERAL (
        SELECT u.group_id, u.head_lb, u.head_id, u.served_n
        FROM unnest(p.group_ids, p.served, p.head_lbs, p.head_ids)
             AS u(group_id, served_n, head_lb, head_id)
        ORDER BY u.served_n, u.head_lb, u.head_id
        LIMIT %(probe_groups)s + 1) f
    UNION ALL
    {claim_pool_special}
)