-- Fragment of claim_owner_walk_cached.sql and claim_owner_walk_scan.sql, between their
-- units and their walk: the owners numbered by the lower bound of their first job's
-- key, (priority, served / weight, best group's served and head).
-- Needs:   CTE units(plan, unit, unit_served, priority, weight, served, head_lb,
--          head_id).
-- Defines: CTE unit_walk (units' columns, v_lb, urank), followed by a comma.
unit_walk AS (
    SELECT u.*, u.unit_served::numeric / u.weight AS v_lb,
           row_number() OVER (ORDER BY u.priority DESC, u.unit_served::numeric / u.weight,
                                       u.served, u.head_lb, u.head_id,
                                       u.plan NULLS FIRST, u.unit) AS urank
    FROM units u
),
