-- Fragment of claim.sql, put in place of its pool placeholder: the group pool for
-- rota's own groups table, whose plan and active fair_groups copies in the same
-- transaction as every change.
-- Needs:   CTEs clock, special, served_delta, edge_fix, running_old, stale_head (and
--          stale, through groupless_head.sql); parameters type, probe_groups.
-- Defines: CTEs levels, pool(group_id, head_lb, head_id, served_n, served_lb, plan,
--          active); includes claim_pool_special.sql.
-- Each plan
-- present is walked through fair_groups_walk_idx by (served_n, head_lb), reading at most
-- probe_groups + 1 groups per plan: for a group outside `special`, served_n is its exact
-- served count, so the walk's order is the order of (served, head_lb). The plans
-- present come from fair_plans. Cost grows with the number of plans and the probe,
-- not with the number of groups or jobs.
levels AS (
    SELECT p.plan FROM {schema}.fair_plans p WHERE p.type = %(type)s
    UNION ALL
    SELECT NULL
),
pool AS (
    SELECT f.group_id, f.head_lb, f.head_id, f.served_n, f.served_n AS served_lb, l.plan,
           true AS active
    FROM levels l
    CROSS JOIN clock c
    CROSS JOIN LATERAL (
        (SELECT f.group_id, f.head_lb, f.head_id, f.served_n FROM {schema}.fair_groups f
         WHERE l.plan IS NOT NULL AND f.type = %(type)s AND f.plan = l.plan
           AND f.active AND f.head_lb < 'infinity' AND f.ready_lb <= c.now
           AND f.head_until > c.now
           AND f.group_id NOT IN (SELECT s.group_id FROM special s)
{cap_filter_group}
         ORDER BY f.served_n, f.head_lb, f.head_id
         LIMIT %(probe_groups)s + 1)
        UNION ALL
        (SELECT f.group_id, f.head_lb, f.head_id, f.served_n FROM {schema}.fair_groups f
         WHERE l.plan IS NULL AND f.type = %(type)s AND f.plan IS NULL
           AND f.active AND f.head_lb < 'infinity' AND f.ready_lb <= c.now
           AND f.head_until > c.now
           AND f.group_id NOT IN (SELECT s.group_id FROM special s)
{cap_filter_group}
         ORDER BY f.served_n, f.head_lb, f.head_id
         LIMIT %(probe_groups)s + 1)
    ) f
    UNION ALL
    {claim_pool_special}
)