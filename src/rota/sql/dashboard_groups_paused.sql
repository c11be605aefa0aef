-- Dashboard `/fairness`: paused groups (their jobs are not claimed), with the pending
-- jobs each holds, read per type from jobs_pending_idx (type, group_id, …), and how
-- many groups are paused in all. The groups relation has no index on active: this
-- reads it whole, one row per group.
WITH paused AS (
    SELECT g.group_id, g.plan, count(*) OVER () AS total
    FROM {groups} g
    WHERE NOT g.active
    ORDER BY g.group_id
    LIMIT %(limit)s
)
SELECT z.group_id, z.plan, z.total,
       (SELECT count(*) FROM {schema}.jobs p
        WHERE p.status = 'pending' AND p.type = ANY(%(types)s::text[])
          AND p.group_id = z.group_id) AS pending
FROM paused z
ORDER BY z.group_id
