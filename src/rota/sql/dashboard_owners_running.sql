-- Dashboard `/fairness`: each owner's running jobs whose lock is fresh (every type), with
-- its plan: what its plan's cap (Plan.max_running) counts (docs/design.md, "Caps"). A
-- group without an owner is its own (own true). Reads jobs_running_group_idx: as many
-- entries as jobs run at once, whatever the backlog.
SELECT coalesce(g.owner_id::text, r.group_id) AS owner_id, g.owner_id IS NULL AS own,
       g.plan::text AS plan, count(*) AS running
FROM {schema}.jobs r
LEFT JOIN {groups} g ON g.group_id::text = r.group_id
WHERE r.status = 'running' AND r.group_id IS NOT NULL
  AND r.locked_at >= now() + %(offset)s::interval - %(stale_after)s::interval
GROUP BY 1, 2, 3
