-- Dashboard `/` and the rota_jobs gauges: per type, pending jobs (due now, due later,
-- in paused groups), running and failed jobs, jobs done in the last hour, and how long
-- the longest-waiting due job of an active group has been due (as `rota depth` counts
-- it: since its run_after, or since it was created when that is later).
-- Pending jobs are read once, index-only, from jobs_pending_idx (it carries run_after),
-- against the paused groups only: joining every pending job to the groups relation, or
-- folding them per group first, cost 110-190 ms at 95,000 pending jobs, this 40-60 ms.
-- Running and failed jobs are counted on their partial indexes; done jobs only for the
-- last hour (jobs_done_idx on finished_at): counting the whole done history reads all
-- of it (280 ms at 880,000 done jobs).
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
paused AS (
    SELECT g.group_id FROM {groups} g WHERE NOT g.active
),
pending AS (
    SELECT p.type,
           count(*) FILTER (WHERE z.group_id IS NULL AND p.run_after <= c.now) AS due,
           count(*) FILTER (WHERE z.group_id IS NULL AND p.run_after > c.now) AS later,
           count(*) FILTER (WHERE z.group_id IS NOT NULL) AS paused,
           min(greatest(p.run_after, p.created_at))
             FILTER (WHERE z.group_id IS NULL AND p.run_after <= c.now) AS due_since
    FROM {schema}.jobs p
    CROSS JOIN clock c
    LEFT JOIN paused z ON z.group_id = p.group_id
    WHERE p.status = 'pending'
    GROUP BY p.type
)
SELECT t.type,
       coalesce(p.due, 0) AS due,
       coalesce(p.later, 0) AS later,
       coalesce(p.paused, 0) AS paused,
       (SELECT count(*) FROM {schema}.jobs r
        WHERE r.status = 'running' AND r.type = t.type) AS running,
       (SELECT count(*) FROM {schema}.jobs f
        WHERE f.status = 'failed' AND f.type = t.type) AS failed,
       (SELECT count(*) FROM {schema}.jobs d
        WHERE d.status = 'done' AND d.type = t.type
          AND d.finished_at > c.now - interval '1 hour' AND d.finished_at <= c.now)
         AS done_last_hour,
       extract(epoch FROM c.now - p.due_since)::float8 AS oldest_due_seconds
FROM unnest(%(types)s::text[]) AS t(type)
CROSS JOIN clock c
LEFT JOIN pending p ON p.type = t.type
ORDER BY t.type
