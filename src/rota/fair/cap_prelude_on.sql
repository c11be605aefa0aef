-- Fragment of claim.sql (the cap_prelude placeholder) when a plan caps its owners'
-- running jobs (Plan.max_running; docs/design.md, "Caps"): the capped plans, and the
-- owners at their cap as this statement's snapshot sees them, whose groups the walk
-- leaves out. An owner is (plan_key, unit) as fair_groups names it: 'o:' || owner_id,
-- or 'g:' || group_id for a group without one. A running job holds a slot while its
-- lock is fresh: one whose lock went stale (its worker died) holds none. Every running
-- job of every type counts, read through jobs_running_group_idx (as many entries as
-- jobs run at once, whatever the backlog), its group looked up in the groups relation.
-- The groups at their own cap (groups.max_running) come from the cap_prelude_group
-- placeholder (cap_prelude_group_on.sql on rota's own groups table, else none).
-- Needs:   CTE clock; parameters plan_ids, plan_caps.
-- Defines: CTEs cap_plans(plan, cap), at_cap(plan_key, unit), at_cap_group(group_id).
cap_plans AS (
    SELECT p.plan, p.cap
    FROM unnest(%(plan_ids)s::text[], %(plan_caps)s::int[]) AS p(plan, cap)
    WHERE p.cap IS NOT NULL
),
at_cap AS MATERIALIZED (
    SELECT 'p:' || g.plan::text AS plan_key,
           CASE WHEN g.owner_id IS NULL THEN 'g:' || g.group_id::text
                ELSE 'o:' || g.owner_id::text END AS unit
    FROM {schema}.jobs r
    JOIN {groups} g ON g.group_id::text = r.group_id
    JOIN cap_plans cp ON cp.plan = g.plan::text
    WHERE r.status = 'running' AND r.locked_at >= (SELECT c.stale_before FROM clock c)
    GROUP BY 1, 2, cp.cap
    HAVING count(*) >= cp.cap
),
{cap_prelude_group}
