-- Dashboard `/fairness`: per plan, how long jobs waited over the last hour: p50, p95
-- and the longest, in seconds, and how many jobs were measured.
-- A job keeps no record of when its last attempt started (the claim's locked_at is
-- refreshed by heartbeats and cleared on completion), so this measures from due to
-- done: finished_at - run_after of jobs done in the last hour, an upper bound of the
-- wait that includes the handler's own time. A started_at column written by the claim
-- would make it the wait itself.
-- Bounded: at most the %(per_type)s jobs of each type done last, read backwards from
-- jobs_done_idx (type, finished_at), one heap fetch each for run_after.
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
recent AS (
    SELECT d.group_id, extract(epoch FROM d.finished_at - d.run_after)::float8 AS wait
    FROM unnest(%(types)s::text[]) AS t(type)
    CROSS JOIN clock c
    CROSS JOIN LATERAL (
        SELECT j.group_id, j.finished_at, j.run_after FROM {schema}.jobs j
        WHERE j.status = 'done' AND j.type = t.type
          AND j.finished_at > c.now - interval '1 hour' AND j.finished_at <= c.now
        ORDER BY j.finished_at DESC
        LIMIT %(per_type)s
    ) d
),
per_group AS (  -- one lookup of the groups relation per group, not per job
    SELECT r.group_id, array_agg(greatest(r.wait, 0)) AS waits
    FROM recent r GROUP BY r.group_id
)
SELECT g.plan,
       count(*) AS jobs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY w.wait) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY w.wait) AS p95,
       max(w.wait) AS longest
FROM per_group pg
LEFT JOIN {groups} g ON g.group_id = pg.group_id
CROSS JOIN LATERAL unnest(pg.waits) AS w(wait)
GROUP BY g.plan
