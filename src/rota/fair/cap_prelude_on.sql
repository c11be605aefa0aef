-- Fragment of claim.sql (the cap_prelude placeholder) when a plan caps its owners'
-- running jobs (Plan.max_running; docs/design.md, "Caps"): the capped plans, and the
-- owners at their cap as this statement's snapshot sees them, whose groups the walk
-- leaves out. An owner is (plan_key, unit) as fair_groups names it: 'o:' || owner_id,
-- or 'g:' || group_id for a group without one. A running job holds a slot while its
-- lock is fresh: one whose lock went stale (its worker died) holds none. The running
-- jobs of every type that a capped claim took for a capped plan are read through
-- jobs_running_slot_idx (the slot each holds, jobs.slot_plan and slot_owner, as many
-- entries as such jobs run at once, whatever the backlog and whatever else runs), and
-- each counts only where its group's plan and owner, as this snapshot sees them, are
-- still the slot's. So the set holds only owners with at least their cap running; an
-- owner at its cap that it misses (its jobs claimed before its plan was capped, or its
-- groups moved to it since) is walked, and its candidates passed over all the same
-- (cap_tail_on.sql counts each capped owner among them exactly): a probe more, never a
-- wrong answer.
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
    SELECT 'p:' || r.slot_plan AS plan_key, r.slot_owner AS unit
    FROM cap_plans cp
    CROSS JOIN LATERAL (
        SELECT r.slot_plan, r.slot_owner, r.group_id
        FROM {schema}.jobs r
        WHERE r.slot_plan = cp.plan AND r.status = 'running'
          AND r.locked_at >= (SELECT c.stale_before FROM clock c)
    ) r
    JOIN {groups} g ON g.group_id::text = r.group_id
    WHERE g.plan::text = r.slot_plan
      AND r.slot_owner = CASE WHEN g.owner_id IS NULL THEN 'g:' || g.group_id::text
                              ELSE 'o:' || g.owner_id::text END
    GROUP BY 1, 2, cp.cap
    HAVING count(*) >= cp.cap
),
{cap_prelude_group}
