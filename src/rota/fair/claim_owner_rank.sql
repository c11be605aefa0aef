-- Fragment of claim_owner_walk_cached.sql and claim_owner_walk_scan.sql, between their
-- units and their walk: the owners numbered by the lower bound of their first job's
-- key, (priority, served / weight, best group's served and head).
-- Then each probed owner's share of the batch and how many of its groups to probe.
-- Needs:   CTEs units(plan, unit, unit_served, priority, weight, served, head_lb,
--          head_id), job_cost; parameters probe_groups, probe_spread, limit.
-- Defines: CTEs unit_walk (units' columns, v_lb, urank), owner_fill, owner_level,
--          unit_sized (unit_walk's columns, share, spread), followed by a comma.
unit_walk AS (
    SELECT u.*, u.unit_served::numeric / u.weight AS v_lb,
           row_number() OVER (ORDER BY u.priority DESC, u.unit_served::numeric / u.weight,
                                       u.served, u.head_lb, u.head_id,
                                       u.plan NULLS FIRST, u.unit) AS urank
    FROM units u
),
-- The share of the batch each probed owner would get if its groups had jobs enough: a
-- water level over the first priority's probed owners by served / weight, in the type's
-- expected cost (an owner gets (level - served / weight) x weight / e places; the level
-- is where the places add up to the limit). Its groups probed (spread): at least
-- probe_spread, and as many as its share has places, since each place may be another
-- group's. An estimate (bench/RESULTS.md, section 21): the cuts prove the answer
-- whatever the sizes, so a wrong one costs a retry or a few rows, never exactness.
owner_fill AS (
    SELECT uw.plan, uw.unit, uw.v_lb AS k, uw.weight / jc.e AS w,
           sum(uw.weight / jc.e) OVER o AS cw,
           sum(uw.v_lb * uw.weight / jc.e) OVER o AS ckw
    FROM unit_walk uw
    CROSS JOIN job_cost jc
    WHERE uw.urank <= %(probe_groups)s
      AND uw.priority = (SELECT max(x.priority) FROM unit_walk x
                         WHERE x.urank <= %(probe_groups)s)
    WINDOW o AS (ORDER BY uw.urank ROWS UNBOUNDED PRECEDING)
),
-- The level: from the last owner whose own key the batch reaches (owners in key order).
owner_level AS (
    SELECT (%(limit)s + f.ckw) / f.cw AS lv
    FROM owner_fill f
    WHERE f.k * f.cw - f.ckw <= %(limit)s
    ORDER BY f.cw DESC
    LIMIT 1
),
unit_sized AS (
    SELECT uw.*, x.share, greatest(%(probe_spread)s::int, ceil(x.share)::int) AS spread
    FROM unit_walk uw
    LEFT JOIN owner_fill ofl ON ofl.plan IS NOT DISTINCT FROM uw.plan AND ofl.unit = uw.unit
    LEFT JOIN owner_level ol ON true
    CROSS JOIN LATERAL (
        SELECT coalesce(greatest(0, (ol.lv - ofl.k) * ofl.w), 0) AS share) x
),
