-- Fragment of claim.sql, put in place of its pool placeholder, while a long transaction
-- holds the xmin horizon (ClaimUpkeep.horizon_held; docs/operations.md, "Long
-- transactions"): the group pool of claim_pool_cached.sql, its walk made one pass over
-- fair_groups. Every fold rewrites the folded groups' rows, and while the horizon is held
-- none of the old versions can go: their walk-index entries pile up at the front of the
-- walk (the groups' old, smaller served counts), where the index walk reads each one and
-- visits its row, and a seq scan per plan reads every page once per plan. This pass reads
-- each page once, keeps the live rows (`group_rows`), and takes a plan's first groups by
-- a bounded (top-N) sort of those rows, a pass a plan present (`sorted_plans`): no sort
-- of every group (which at 10,000 groups cost more than the read), and no rereading of
-- fair_groups' versions per plan. Its cost is a read of the type's groups and a pass
-- over their live rows a plan (bench/RESULTS.md, sections 14 and 24); the index walk
-- avoids it when the horizon moves.
-- The special groups' rows come from the same read (special_group_row_read.sql, which
-- FairClaim.statement passes as claim_pool_special.sql's special_group_row).
-- Needs:   CTEs clock, special, served_delta, edge_fix, running_old, stale_head (and
--          stale, through groupless_head.sql); parameters type, probe_groups.
-- Defines: CTEs group_rows, sorted_plans(plan), pool(group_id, head_lb, head_id,
--          served_n, served_lb, plan, active); includes claim_pool_special.sql.
-- The one read of the type's rows (their live versions), for the walk and the special
-- groups.
group_rows AS MATERIALIZED (
    SELECT f.group_id, f.plan, f.active, f.served_n, f.head_lb, f.head_id, f.head_until,
           f.ready_lb, f.plan_key, f.unit  -- the owner, for cap_filter_group_on.sql
    FROM {schema}.fair_groups f
    WHERE f.type = %(type)s
),
-- The plans present, as the index walk's levels (fair_plans, and the group-less plan).
sorted_plans AS (
    SELECT p.plan FROM {schema}.fair_plans p WHERE p.type = %(type)s
    UNION ALL
    SELECT NULL
),
-- The same groups as the index walk: per plan, the first probe_groups + 1 active groups
-- with a valid head, ready now and not special, by (served_n, head_lb, head_id), each
-- plan's by a bounded (top-N) sort of the pass's rows: one pass over the materialized
-- live rows a plan, whose rows past the N kept are dropped at one comparison each.
-- Gathering each plan's rows into arrays and sorting their unnest cost twice as much
-- at 10,000 groups (bench/RESULTS.md, section 24).
pool AS (
    SELECT w.group_id, w.head_lb, w.head_id, w.served_n, w.served_n AS served_lb, p.plan,
           true AS active
    FROM sorted_plans p
    CROSS JOIN clock c
    CROSS JOIN LATERAL (
        SELECT f.group_id, f.head_lb, f.head_id, f.served_n
        FROM group_rows f
        WHERE f.plan IS NOT DISTINCT FROM p.plan
          AND f.active AND f.head_lb < 'infinity' AND f.ready_lb <= c.now
          AND f.head_until > c.now
          AND f.group_id NOT IN (SELECT s.group_id FROM special s)
{cap_filter_group}
        ORDER BY f.served_n, f.head_lb, f.head_id
        LIMIT %(probe_groups)s + 1) w
    UNION ALL
    {claim_pool_special}
)