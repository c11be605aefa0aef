-- Dashboard `/jobs`: jobs newest first, filtered by type, status, group, id and the run
-- that claimed them last (a NULL filter matches everything), a page at a time. Keyset on id, and bounded: it reads at
-- most the ids in [%(low)s, %(before)s) backwards on the primary key, however rare the
-- filter's matches (no index serves every combination of filters; a group's done
-- jobs have none), so a page may hold fewer than %(limit)s jobs and the next one
-- continues below %(low)s. The plan is looked up for the jobs shown only.
WITH page AS (
    SELECT j.id, j.type, j.group_id, j.status, j.attempts, j.max_attempts, j.deferrals,
           j.run_after, j.created_at, j.finished_at, j.last_error, j.run_id
    FROM {schema}.jobs j
    WHERE j.id < %(before)s AND j.id >= %(low)s
      AND (%(type)s::text IS NULL OR j.type = %(type)s::text)
      AND (%(status)s::text IS NULL OR j.status = %(status)s::text)
      AND (%(group_id)s::text IS NULL OR j.group_id = %(group_id)s::text)
      AND (%(run_id)s::uuid IS NULL OR j.run_id = %(run_id)s::uuid)
    ORDER BY j.id DESC
    LIMIT %(limit)s
)
SELECT p.*, g.plan
FROM page p
LEFT JOIN {groups} g ON g.group_id = p.group_id
ORDER BY p.id DESC
