-- Fragment of claim_pool_cached.sql, the branches of its pool after the walk of the
-- ordinary groups: the special groups (their rows fetched one by one, with exact
-- served counts) and the group-less jobs.
-- Needs:   CTEs clock, special, served_delta, edge_fix, running_old, stale_head (and
--          stale, through groupless_head.sql); parameter type.
-- Defines: rows (group_id, head_lb, head_id, served_n, served_lb, plan, active), to
--          follow a UNION ALL; includes claim_head.sql and groupless_head.sql.
    -- The special groups, with exact served counts, each with its fair_groups row (fg),
    -- whose copy of plan and active is the group's (fair_copy_group keeps it in the
    -- transaction of every change to the groups table), or, for a group without one,
    -- its groups row (g). The groups rows are fetched one by one (LATERAL … OFFSET 0
    -- keeps each a parameterized index lookup; joined flat, the generic plan hashed all
    -- of fair_groups and groups, (bench/RESULTS.md, "Planner notes")).
    SELECT s.group_id, hd.head, hd.head_id,
           coalesce(fg.served_n, 0),
           coalesce(fg.served_n, 0) + coalesce(dd.n, 0) + coalesce(ef.n, 0)
             - coalesce(ro.n, 0),
           CASE WHEN fg.group_id IS NOT NULL THEN fg.plan ELSE g.plan END,
           CASE WHEN fg.group_id IS NOT NULL THEN fg.active ELSE coalesce(g.active, true)
           END
    FROM special s
    CROSS JOIN clock c
    {special_group_row}
    LEFT JOIN LATERAL (
        SELECT x.plan, x.active FROM {groups} x
        WHERE fg.group_id IS NULL AND x.group_id = s.group_id OFFSET 0
    ) g ON true
    LEFT JOIN stale_head sh ON sh.group_id = s.group_id
    {claim_head}
    LEFT JOIN served_delta dd ON dd.group_id = s.group_id
    LEFT JOIN edge_fix ef ON ef.group_id = s.group_id
    LEFT JOIN running_old ro ON ro.group_id = s.group_id
    WHERE sh.head IS NOT NULL OR fg.ready_lb <= c.now
    UNION ALL
    -- The group-less jobs, one group of their own (served 0, the middle plan).
    SELECT NULL, h.head, h.head_id, 0, 0, NULL, true
    FROM {groupless_head} h
