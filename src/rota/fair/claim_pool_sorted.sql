-- Fragment of claim.sql, put in place of its pool placeholder, while a long transaction
-- holds the xmin horizon (ClaimUpkeep.horizon_held; docs/operations.md, "Long
-- transactions"): the group pool of claim_pool_cached.sql, its walk made one pass over
-- fair_groups. Every fold rewrites the folded groups' rows, and while the horizon is held
-- none of the old versions can go: their walk-index entries pile up at the front of the
-- walk (the groups' old, smaller served counts), where the index walk reads each one and
-- visits its row, and a seq scan per plan reads every page once per plan. This pass reads
-- each page once into `sorted_from` and keeps, per plan, the first groups by a bounded
-- (top-N) sort of its rows there: no sort of every group, which at 10,000 groups cost
-- more than the scan (bench/RESULTS.md, section 14). It costs a read of the type's
-- groups, which the index walk avoids when the horizon moves.
-- Needs:   CTEs clock, special, served_delta, edge_fix, running_old, stale_head (and
--          stale, through groupless_head.sql); parameters type, probe_groups.
-- Defines: CTEs sorted_from, sorted_levels, pool(group_id, head_lb, head_id, served_n,
--          served_lb, plan, active); includes claim_pool_special.sql.
-- The same groups as the index walk: per plan present (fair_plans lists every plan a
-- type's groups have, and no plan), the first probe_groups + 1 active groups with a valid
-- head, ready now and not special, by (served_n, head_lb, head_id).
sorted_from AS MATERIALIZED (
    SELECT f.group_id, f.head_lb, f.head_id, f.served_n, f.plan
    FROM {schema}.fair_groups f, clock c
    WHERE f.type = %(type)s
      AND f.active AND f.head_lb < 'infinity' AND f.ready_lb <= c.now
      AND f.head_until > c.now
      AND f.group_id NOT IN (SELECT s.group_id FROM special s)
),
sorted_levels AS (
    SELECT p.plan FROM {schema}.fair_plans p WHERE p.type = %(type)s
    UNION ALL
    SELECT NULL
),
pool AS (
    SELECT f.group_id, f.head_lb, f.head_id, f.served_n, f.served_n AS served_lb, l.plan,
           true AS active
    FROM sorted_levels l
    CROSS JOIN LATERAL (
        SELECT f.group_id, f.head_lb, f.head_id, f.served_n FROM sorted_from f
        WHERE f.plan IS NOT DISTINCT FROM l.plan
        ORDER BY f.served_n, f.head_lb, f.head_id
        LIMIT %(probe_groups)s + 1) f
    UNION ALL
    {claim_pool_special}
)