-- Fragment of claim.sql, put in place of its pool placeholder: the group pool for
-- rota's own groups table, whose plan and active fair_groups copies in the same
-- transaction as every change.
-- Needs:   CTEs clock, special, served_delta, edge_fix, running_old, stale_head (and
--          stale, through groupless_head.sql); parameters type, probe_groups.
-- Defines: CTEs levels(plan, f_served, f_head_lb, f_head_id), pool(group_id, head_lb,
--          head_id, served_n, served_lb, plan, active); includes
--          claim_pool_special.sql.
-- Each plan
-- present is walked through fair_groups_walk_idx by (served_n, head_lb), reading at most
-- probe_groups + 1 groups per plan: for a group outside `special`, served_n is its exact
-- served count, so the walk's order is the order of (served, head_lb). The plans
-- present come from fair_plans. Cost grows with the number of plans and the probe,
-- not with the number of groups or jobs. Each plan's walk starts at its floor
-- (fair_walk_floor, level 'group': a lower bound of the key of every group outside
-- `special`), past the dead versions a long transaction keeps below it.
levels AS (
    SELECT l.plan, coalesce(w.served_n, '-Infinity') AS f_served,
           coalesce(w.head_lb, '-infinity') AS f_head_lb, coalesce(w.head_id, -1) AS f_head_id
    FROM (SELECT p.plan FROM {schema}.fair_plans p WHERE p.type = %(type)s
          UNION ALL
          SELECT NULL) l
    LEFT JOIN LATERAL (
        SELECT w.served_n, w.head_lb, w.head_id FROM {schema}.fair_walk_floor w
        WHERE w.type = %(type)s AND w.level = 'group'
          AND w.plan_key = coalesce('p:' || l.plan, '')
        ORDER BY w.seq DESC LIMIT 1) w ON true
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
           AND (f.served_n, f.head_lb, f.head_id) >= (l.f_served, l.f_head_lb, l.f_head_id)
           AND f.group_id NOT IN (SELECT s.group_id FROM special s)
{cap_filter_group}
         ORDER BY f.served_n, f.head_lb, f.head_id
         LIMIT %(probe_groups)s + 1)
        UNION ALL
        (SELECT f.group_id, f.head_lb, f.head_id, f.served_n FROM {schema}.fair_groups f
         WHERE l.plan IS NULL AND f.type = %(type)s AND f.plan IS NULL
           AND f.active AND f.head_lb < 'infinity' AND f.ready_lb <= c.now
           AND f.head_until > c.now
           AND (f.served_n, f.head_lb, f.head_id) >= (l.f_served, l.f_head_lb, l.f_head_id)
           AND f.group_id NOT IN (SELECT s.group_id FROM special s)
{cap_filter_group}
         ORDER BY f.served_n, f.head_lb, f.head_id
         LIMIT %(probe_groups)s + 1)
    ) f
    UNION ALL
    {claim_pool_special}
)