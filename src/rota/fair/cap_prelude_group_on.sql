-- Fragment of cap_prelude_on.sql (the cap_prelude_group placeholder) on rota's own
-- groups table: the groups at their own cap (groups.max_running; docs/design.md,
-- "Caps") as this statement's snapshot sees them, which the group walks leave out
-- (cap_filter_group_on.sql; an optimisation: cap_tail_on.sql passes over their jobs
-- anyway). Their running jobs with a fresh lock, every type, through
-- jobs_running_group_idx; nothing is read while no group is capped (the smallest cap,
-- through groups_capped_idx: one probe whatever the statistics).
-- Needs:   CTE clock.
-- Defines: CTE at_cap_group(group_id).
at_cap_group AS MATERIALIZED (
    SELECT r.group_id
    FROM {schema}.jobs r
    JOIN {schema}.groups g ON g.group_id = r.group_id
    WHERE (SELECT min(x.max_running) FROM {schema}.groups x) IS NOT NULL
      AND g.max_running IS NOT NULL
      AND r.status = 'running' AND r.locked_at >= (SELECT c.stale_before FROM clock c)
    GROUP BY r.group_id, g.max_running
    HAVING count(*) >= g.max_running
),
