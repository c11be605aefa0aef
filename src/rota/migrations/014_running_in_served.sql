-- Running jobs in the served counts of the bookkeeping (issue 4: stale and stuck running
-- jobs must not slow the claim). Until now the claim counted a group's running jobs in
-- the window live, and every group with one joined the claim's special set: 10,000
-- stuck jobs (stale lock, attempts used up, waiting for fail_stuck_jobs) over 10,000
-- groups made a claim at 1,000,000 pending jobs take 55 ms instead of 3.5.
-- From here a running job counts in fair_done / fair_groups.done_n like a done job
-- (the triggers of 011 and 012 add it when it enters running and take it away when it
-- leaves; a completion nets to nothing). The claim subtracts, exactly, the running jobs
-- locked before the window start (normally none). done_n is now "served since the edge":
-- done jobs finished at or after the edge plus running jobs.

-- Deleted running rows leave the counts too.
CREATE OR REPLACE FUNCTION {schema}.fair_jobs_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(id) AS ids,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished
    INTO r FROM deleted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_done(r.types, r.groups, r.ids, r.finished, -1);
    END IF;
    RETURN NULL;
END
$$;

-- The running jobs that exist now (the triggers count them from here on).
INSERT INTO {schema}.fair_done AS fd (type, group_id, shard, n)
SELECT j.type, j.group_id, 0::smallint, count(*)::int
FROM {schema}.jobs j
WHERE j.status = 'running' AND j.group_id IS NOT NULL
GROUP BY j.type, j.group_id
ORDER BY 1, 2
ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fd.n + excluded.n;
