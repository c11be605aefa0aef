-- Dashboard `/fairness`: the groups whose oldest due job has waited longest (since its
-- run_after, or its creation when that is later), among groups not paused, with how
-- many pending jobs they hold and their plan.
-- One index-only read of jobs_pending_idx (it carries run_after) keeps the
-- %(scan)s longest-waiting due jobs (a top-N sort, no per-group aggregate: folding
-- 76,000 due jobs per group cost 120 ms, this about a third); the groups among them,
-- by their first appearance, are the longest-waiting groups (fewer than %(limit)s only
-- when those jobs span fewer groups).
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
paused AS (
    SELECT g.group_id FROM {groups} g WHERE NOT g.active
),
oldest_jobs AS (
    SELECT p.group_id, greatest(p.run_after, p.created_at) AS due_since
    FROM {schema}.jobs p
    CROSS JOIN clock c
    LEFT JOIN paused z ON z.group_id = p.group_id
    WHERE p.status = 'pending' AND p.run_after <= c.now
      AND p.group_id IS NOT NULL AND z.group_id IS NULL
    ORDER BY greatest(p.run_after, p.created_at), p.group_id
    LIMIT %(scan)s
),
waiting AS (
    SELECT o.group_id, min(o.due_since) AS due_since
    FROM oldest_jobs o
    GROUP BY o.group_id
    ORDER BY min(o.due_since), o.group_id
    LIMIT %(limit)s
)
SELECT w.group_id, g.plan,
       (SELECT count(*) FROM {schema}.jobs p
        WHERE p.status = 'pending' AND p.type = ANY(%(types)s::text[])
          AND p.group_id = w.group_id) AS pending,
       extract(epoch FROM c.now - w.due_since)::float8 AS waited_seconds
FROM waiting w
CROSS JOIN clock c
LEFT JOIN {groups} g ON g.group_id = w.group_id
ORDER BY w.due_since, w.group_id
