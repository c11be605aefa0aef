-- `rota depth`: open jobs per type and plan (the plan of the job's group; NULL for jobs
-- with no group or a group with no owner). `due` is what a claim could take now (pending,
-- due, group not paused); `scheduled` waits for its run_after (backoff, deferral, quota
-- reset); `paused` sits in paused groups; `running` is claimed.
SELECT j.type,
       g.plan,
       count(*) FILTER (WHERE j.status = 'pending' AND coalesce(g.active, true)
                          AND j.run_after <= now() + %(offset)s::interval) AS due,
       count(*) FILTER (WHERE j.status = 'pending' AND coalesce(g.active, true)
                          AND j.run_after > now() + %(offset)s::interval) AS scheduled,
       count(*) FILTER (WHERE j.status = 'pending' AND NOT coalesce(g.active, true))
         AS paused,
       count(*) FILTER (WHERE j.status = 'running') AS running,
       extract(epoch FROM now() + %(offset)s::interval
               - min(j.run_after) FILTER (WHERE j.status = 'pending'
                                            AND coalesce(g.active, true)
                                            AND j.run_after <= now() + %(offset)s::interval)
       )::float8 AS oldest_due_seconds
FROM {schema}.jobs j
LEFT JOIN {groups} g ON g.group_id = j.group_id
WHERE j.status IN ('pending', 'running')
GROUP BY j.type, g.plan
ORDER BY j.type, g.plan NULLS FIRST
