-- Metrics: jobs that finished in (%(since)s, %(until)s] per type, plan and status, and
-- the cost charged to the done ones (docs/design.md, "Cost"), for the
-- rota_jobs_completed_total, rota_jobs_failed_total and rota_jobs_cost_charged_total
-- counters, which add each scrape's interval to what they counted before.
-- Done jobs: per type, a range of jobs_done_idx (type, finished_at, group_id),
-- index-only. Failed jobs: only the newest %(failed_per_type)s of each type (see
-- dashboard_throughput.sql: there is no index on their finished_at). Folded per group
-- before the groups relation is joined for the plan.
WITH types AS (SELECT t.type FROM unnest(%(types)s::text[]) AS t(type)),
finished AS (
    SELECT t.type, d.group_id, 'done' AS status, d.cost
    FROM types t
    CROSS JOIN LATERAL (
        SELECT j.group_id, j.cost FROM {schema}.jobs j
        WHERE j.status = 'done' AND j.type = t.type
          AND j.finished_at > %(since)s AND j.finished_at <= %(until)s
    ) d
    UNION ALL
    SELECT t.type, f.group_id, 'failed', 0::numeric
    FROM types t
    CROSS JOIN LATERAL (
        SELECT j.group_id, j.finished_at FROM {schema}.jobs j
        WHERE j.status = 'failed' AND j.type = t.type
        ORDER BY j.id DESC
        LIMIT %(failed_per_type)s
    ) f
    WHERE f.finished_at > %(since)s AND f.finished_at <= %(until)s
),
per_group AS (
    SELECT x.type, x.group_id, x.status, count(*) AS n, sum(x.cost) AS cost
    FROM finished x
    GROUP BY x.type, x.group_id, x.status
)
SELECT pg.type, g.plan, pg.status, sum(pg.n)::bigint AS n, sum(pg.cost) AS cost
FROM per_group pg
LEFT JOIN {groups} g ON g.group_id = pg.group_id
GROUP BY pg.type, g.plan, pg.status
ORDER BY pg.type, g.plan NULLS FIRST, pg.status
