-- Fragment of claim.sql, put in place of its pool placeholder for fair_by "owner" on
-- rota's own groups table (docs/fast-claim.md, "The owner level"): the groups whose
-- owner's row (fair_owners) may not hold their key: the special groups (claim.sql),
-- which include those recorded in fair_owner_changes that the type's fold mark does
-- not cover (bounds lowered, new or moved since their owner's row was computed). Each
-- gets its exact served count and its owner; claim_owner_walk_cached.sql makes their
-- owners special.
-- Needs:   CTEs clock, special, served_delta, edge_fix, running_old, stale_head;
--          parameter type.
-- Defines: CTEs special_rows(group_id, served_n, served, adj, plan, active, unit,
--          plan_key, head_lb, head_id, head_until, ready_lb),
--          pool(group_id, head_lb, head_id, served_lb, plan, plan_key, unit): those of
--          them that may have a claimable job now, with their heads; includes
--          claim_head.sql.
-- Rows fetched one by one (LATERAL, as claim_pool_special.sql does). A group
-- with a fair_groups row has its plan, active and owner from the row's copy (kept in the
-- transaction of every change to the groups table, fair_copy_group); only a group
-- without one (the fold drops the row of a group with no pending job and nothing
-- served) is looked up in the groups table: one index read a special group, not two.
special_rows AS (
    SELECT s.group_id, coalesce(f.served_n, 0) AS served_n,
           coalesce(f.served_n, 0) + coalesce(dd.n, 0) + coalesce(ef.n, 0)
             - coalesce(ro.n, 0) AS served,
           coalesce(dd.n, 0) + coalesce(ef.n, 0) - coalesce(ro.n, 0) AS adj,
           CASE WHEN f.group_id IS NOT NULL THEN f.plan ELSE g.plan END AS plan,
           CASE WHEN f.group_id IS NOT NULL THEN f.active
                ELSE coalesce(g.active, true) END AS active,
           CASE WHEN f.group_id IS NOT NULL THEN f.unit
                WHEN g.owner_id IS NULL THEN 'g:' || s.group_id
                ELSE 'o:' || g.owner_id END AS unit,
           CASE WHEN f.group_id IS NOT NULL THEN f.plan_key
                ELSE coalesce('p:' || g.plan, '') END AS plan_key,
           f.head_lb, f.head_id, f.head_until, f.ready_lb
    FROM special s
    LEFT JOIN LATERAL (
        SELECT x.head_lb, x.head_id, x.head_until, x.ready_lb, x.served_n, x.plan,
               x.active, x.unit, x.plan_key, x.group_id
        FROM {schema}.fair_groups x
        -- Newest version first, as special_group_row.sql reads it.
        WHERE x.type = %(type)s AND x.group_id >= s.group_id AND x.group_id <= s.group_id
        ORDER BY x.group_id DESC LIMIT 1) f ON true
    LEFT JOIN LATERAL (
        SELECT x.plan, x.active, x.owner_id FROM {groups} x
        WHERE f.group_id IS NULL AND x.group_id = s.group_id OFFSET 0) g ON true
    LEFT JOIN served_delta dd ON dd.group_id = s.group_id
    LEFT JOIN edge_fix ef ON ef.group_id = s.group_id
    LEFT JOIN running_old ro ON ro.group_id = s.group_id
),
pool AS (
    SELECT fg.group_id, hd.head AS head_lb, hd.head_id, fg.served AS served_lb, fg.plan,
           fg.plan_key, fg.unit
    FROM special_rows fg
    CROSS JOIN clock c
    LEFT JOIN stale_head sh ON sh.group_id = fg.group_id
    {claim_head}
    WHERE fg.active AND (sh.head IS NOT NULL OR fg.ready_lb <= c.now)
)
