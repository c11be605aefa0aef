-- `rota jobs`: the newest jobs, optionally filtered by status, type and group (a NULL
-- filter matches everything), with the plan of the job's group.
SELECT j.id, j.type, j.group_id, g.plan, j.status, j.attempts, j.max_attempts, j.deferrals,
       j.run_after, j.locked_at, j.created_at, j.finished_at, j.last_error, j.dedupe_key,
       j.give_up_pending
FROM {schema}.jobs j
LEFT JOIN {groups} g ON g.group_id = j.group_id
WHERE (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(type)s::text IS NULL OR j.type = %(type)s::text)
  AND (%(group_id)s::text IS NULL OR j.group_id = %(group_id)s::text)
ORDER BY j.id DESC
LIMIT %(limit)s
