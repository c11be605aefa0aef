-- Fragment of claim.sql, put in place of its pool placeholder: the group pool for a
-- groups relation that is the application's (a view, say): plan and active can change
-- there without rota knowing, so every group with pending jobs is read with its live
-- plan and exact served count. Correct, but its cost grows with the number of groups
-- (bench/RESULTS.md); rota's own groups table uses claim_pool_cached.sql instead.
-- Needs:   CTEs clock, served_delta, edge_fix, running_old, stale_head (and stale,
--          through groupless_head.sql); parameter type.
-- Defines: CTE pool(group_id, head_lb, head_id, served_n, served_lb, plan, active);
--          includes claim_head.sql and groupless_head.sql.
pool AS (
    SELECT fg.group_id, hd.head AS head_lb, hd.head_id, fg.served_n,
           fg.served_n + coalesce(dd.n, 0) + coalesce(ef.n, 0) - coalesce(ro.n, 0)
             AS served_lb,
           g.plan, coalesce(g.active, true) AS active
    FROM {schema}.fair_groups fg
    CROSS JOIN clock c
    LEFT JOIN stale_head sh ON sh.group_id = fg.group_id
    {claim_head}
    LEFT JOIN {groups} g ON g.group_id = fg.group_id
    LEFT JOIN served_delta dd ON dd.group_id = fg.group_id
    LEFT JOIN edge_fix ef ON ef.group_id = fg.group_id
    LEFT JOIN running_old ro ON ro.group_id = fg.group_id
    WHERE fg.type = %(type)s AND (fg.ready_lb <= c.now OR sh.head IS NOT NULL)
    UNION ALL
    SELECT sh.group_id, sh.head, sh.head_id, 0,
           coalesce(dd.n, 0) + coalesce(ef.n, 0) - coalesce(ro.n, 0),
           g.plan, coalesce(g.active, true)
    FROM stale_head sh
    LEFT JOIN {groups} g ON g.group_id = sh.group_id
    LEFT JOIN served_delta dd ON dd.group_id = sh.group_id
    LEFT JOIN edge_fix ef ON ef.group_id = sh.group_id
    LEFT JOIN running_old ro ON ro.group_id = sh.group_id
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_groups fg
                      WHERE fg.type = %(type)s AND fg.group_id = sh.group_id)
    UNION ALL
    SELECT NULL, h.head, h.head_id, 0, 0, NULL, true
    FROM {groupless_head} h
)