-- admin.depth (`rota depth`): open jobs per type and plan (the plan of the job's group;
-- NULL for jobs with no group or a group with no owner). `due` is what a claim could
-- take now (pending, due, group not paused); `scheduled` waits for its run_after
-- (backoff, deferral, quota reset); `paused` sits in paused groups; `running` is
-- claimed. `oldest_due_seconds` is how long the longest-waiting due job has been due:
-- since its run_after, or since it was created when its run_after was earlier (a job
-- enqueued with a due time in the past has waited no longer than it has existed).
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
               - min(greatest(j.run_after, j.created_at)) FILTER (WHERE j.status = 'pending'
                                            AND coalesce(g.active, true)
                                            AND j.run_after <= now() + %(offset)s::interval)
       )::float8 AS oldest_due_seconds
FROM (  -- each branch reads its partial index, never the done and failed history
    SELECT p.type, p.group_id, p.status, p.run_after, p.created_at
    FROM {schema}.jobs p WHERE p.status = 'pending'
    UNION ALL
    SELECT r.type, r.group_id, r.status, r.run_after, r.created_at
    FROM {schema}.jobs r WHERE r.status = 'running'
) j
LEFT JOIN {groups} g ON g.group_id = j.group_id
GROUP BY j.type, g.plan
ORDER BY j.type, g.plan NULLS FIRST
