-- Fragment of claim_order_owner.sql, put in place of its owner_walk placeholder for
-- the pool of claim_pool_owner.sql (every group of the type with its owner): the owners
-- in order of their first job's lower bound, and the groups of the first probe_groups.
-- Needs:   CTEs pool, plan_priority, job_cost; parameters middle_priority,
--          lowest_priority, middle_weight, lowest_weight, probe_groups, probe_spread,
--          limit.
-- Defines: CTEs keyed, units, unit_walk(plan, unit, unit_served, priority, weight,
--          served, head_lb, head_id, v_lb, urank), walk(group_id, head_lb, head_id,
--          served, plan, unit, unit_served, priority, weight, share, spread, grank);
--          includes claim_owner_rank.sql.
keyed AS (
    SELECT pl.group_id, pl.head_lb, pl.head_id, pl.served_lb AS served, pl.plan, pl.unit,
           pl.unit_served,
           CASE WHEN pl.group_id IS NULL OR pl.plan IS NULL THEN %(middle_priority)s::int
                ELSE coalesce(pp.priority, %(lowest_priority)s::int) END AS priority,
           CASE WHEN pl.group_id IS NULL OR pl.plan IS NULL THEN %(middle_weight)s::int
                ELSE coalesce(pp.weight, %(lowest_weight)s::int) END AS weight
    FROM pool pl
    LEFT JOIN plan_priority pp ON pp.plan = pl.plan
    WHERE pl.active
{cap_filter_scan}
),
-- Each owner (per plan) with its best group: the lower bound of its first job's key.
units AS (
    SELECT DISTINCT ON (k.plan, k.unit) k.plan, k.unit, k.unit_served, k.priority,
           k.weight, k.served, k.head_lb, k.head_id
    FROM keyed k
    ORDER BY k.plan, k.unit, k.served, k.head_lb, k.head_id, k.group_id NULLS FIRST
),
{claim_owner_rank}
-- The groups of the first probe_groups owners, numbered by (served, head) within their
-- owner; the first spread of each are probed (claim_owner_rank.sql), the next one bounds
-- the rest.
walk AS (
    SELECT k.group_id, k.head_lb, k.head_id, k.served, k.plan, k.unit, k.unit_served,
           k.priority, k.weight, uw.share, uw.spread,
           row_number() OVER (PARTITION BY k.plan, k.unit
                              ORDER BY k.served, k.head_lb, k.head_id,
                                       k.group_id NULLS FIRST) AS grank
    FROM keyed k
    JOIN unit_sized uw ON uw.plan IS NOT DISTINCT FROM k.plan AND uw.unit = k.unit
    WHERE uw.urank <= %(probe_groups)s
)
