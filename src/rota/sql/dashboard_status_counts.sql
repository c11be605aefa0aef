-- Dashboard `/` and the rota_jobs gauges: per type, pending jobs (due now, due later,
-- in paused groups), running and failed jobs, and jobs done in the last hour.
-- Pending jobs are read index-only from jobs_pending_idx (it carries run_after),
-- against the paused groups only (joining every pending job to the groups relation, or
-- folding them per group first, cost 110-190 ms at 95,000 pending jobs; this 40-60 ms),
-- and at most %(cap)s of each type (NULL: all; the metrics count all): reading every
-- pending job costs about 0.7 ms per 1,000 (770 ms for the page at 1,000,000 pending),
-- so a page counts up to the cap and says "at least" (`pending_read` = the cap).
-- Running and failed jobs are counted on their partial indexes; done jobs only for the
-- last hour (jobs_done_idx on finished_at): counting the whole done history reads all
-- of it (280 ms at 880,000 done jobs).
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
paused AS (
    SELECT g.group_id FROM {groups} g WHERE NOT g.active
)
SELECT t.type, pc.due, pc.later, pc.paused, pc.pending_read,
       (SELECT count(*) FROM {schema}.jobs r
        WHERE r.status = 'running' AND r.type = t.type) AS running,
       (SELECT count(*) FROM {schema}.jobs f
        WHERE f.status = 'failed' AND f.type = t.type) AS failed,
       (SELECT count(*) FROM {schema}.jobs d
        WHERE d.status = 'done' AND d.type = t.type
          AND d.finished_at > c.now - interval '1 hour' AND d.finished_at <= c.now)
         AS done_last_hour
FROM unnest(%(types)s::text[]) AS t(type)
CROSS JOIN clock c
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE z.group_id IS NULL AND p.run_after <= c.now) AS due,
           count(*) FILTER (WHERE z.group_id IS NULL AND p.run_after > c.now) AS later,
           count(*) FILTER (WHERE z.group_id IS NOT NULL) AS paused,
           count(*) AS pending_read
    FROM (
        SELECT j.group_id, j.run_after FROM {schema}.jobs j
        WHERE j.status = 'pending' AND j.type = t.type
        LIMIT %(cap)s
    ) p
    LEFT JOIN paused z ON z.group_id = p.group_id
) pc
ORDER BY t.type
