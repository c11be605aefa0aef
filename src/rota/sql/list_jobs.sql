-- admin.list_jobs (`rota jobs`): jobs newest first, optionally filtered by status, type,
-- group and id (a NULL filter matches everything), with the plan of the job's group.
-- Keyset pagination: `before_id` is the cursor (the last id of the previous page), so a
-- page starts where the previous one stopped in the primary key instead of walking past
-- every earlier row as OFFSET would. The caller asks for one row more than it shows, to
-- know whether another page follows. Measured on 1,000,000 jobs: a page of 50 in 2 ms and
-- of 1,000 in 23 ms at any depth (a backward scan of jobs_pkey); a filter that matches
-- nothing reads the whole key, 135 ms.
SELECT j.*, g.plan
FROM {schema}.jobs j
LEFT JOIN {groups} g ON g.group_id = j.group_id
WHERE (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(type)s::text IS NULL OR j.type = %(type)s::text)
  AND (%(group_id)s::text IS NULL OR j.group_id = %(group_id)s::text)
  AND (%(job_id)s::bigint IS NULL OR j.id = %(job_id)s::bigint)
  AND (%(before_id)s::bigint IS NULL OR j.id < %(before_id)s::bigint)
ORDER BY j.id DESC
LIMIT %(limit)s
