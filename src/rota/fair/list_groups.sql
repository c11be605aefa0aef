-- Groups (rota's table or the application's groups relation) in group_id order, from
-- just after %(after)s (null: the first), at most %(limit)s: `rota groups list`. With
-- each, the cost charged to it in the served window, all types summed, from the fair
-- claim's bookkeeping (docs/design.md, "Cost"): its fair_groups rows' folded served
-- counts (fair_groups_group_idx) and its deltas not folded yet (one pass over
-- fair_served, the unfolded tail, for the whole page). And its running jobs with a fresh
-- lock, and its owner's on its plan (every group of the owner; a group without one is
-- its own), which the plan's cap counts (docs/design.md, "Caps"), every type, through
-- jobs_running_group_idx. And the group's own cap (the group_cap placeholder:
-- group_cap_on.sql, max_running, on rota's own groups table; else none).
WITH page AS (
    SELECT g.group_id::text AS group_id, g.owner_id::text AS owner_id, g.plan::text AS plan,
           g.active, {group_cap} AS max_running
    FROM {groups} g
    WHERE %(after)s::text IS NULL OR g.group_id::text > %(after)s::text
    ORDER BY g.group_id::text
    LIMIT %(limit)s
),
unfolded AS (
    SELECT f.group_id, sum(f.n) AS n
    FROM {schema}.fair_served f
    WHERE f.group_id IN (SELECT p.group_id FROM page p)
    GROUP BY f.group_id
)
SELECT p.group_id, p.owner_id, p.plan, p.active, p.max_running,
       coalesce((SELECT sum(fg.served_n) FROM {schema}.fair_groups fg
                 WHERE fg.group_id = p.group_id), 0) + coalesce(u.n, 0) AS served,
       (SELECT count(*) FROM {schema}.jobs r
        WHERE r.group_id = p.group_id AND r.status = 'running'
          AND r.locked_at >= now() + %(offset)s::interval - %(stale_after)s::interval)
         AS running,
       (SELECT count(*) FROM {schema}.jobs r
        WHERE r.group_id IN (SELECT g.group_id::text FROM {groups} g
                             WHERE g.group_id::text = p.group_id
                                OR (g.owner_id::text = p.owner_id
                                    AND g.plan::text IS NOT DISTINCT FROM p.plan))
          AND r.status = 'running'
          AND r.locked_at >= now() + %(offset)s::interval - %(stale_after)s::interval)
         AS owner_running
FROM page p
LEFT JOIN unfolded u ON u.group_id = p.group_id
ORDER BY p.group_id
