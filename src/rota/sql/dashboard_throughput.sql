-- Dashboard `/`: jobs done and failed per minute over the last hour, all types
-- (minute 0 is the last minute; minutes without any are absent), and whether the
-- failed count may be incomplete.
-- Done jobs: per type, a range of jobs_done_idx (type, finished_at), index-only.
-- Failed jobs have no index on finished_at, and reading them all to filter on it cost
-- 111 ms at 20,000 failed jobs (every one a heap fetch). So this reads only the newest
-- %(failed_per_type)s failed jobs of each type (jobs_failed_idx (type, id), newest
-- first): a job created before those that failed in the last hour is missed, and
-- `failed_capped` says when that could have happened (the cap was reached). An index
-- jobs (finished_at) WHERE status = 'failed' would make this an exact range read.
WITH clock AS (SELECT now() + %(offset)s::interval AS now),
types AS (SELECT t.type FROM unnest(%(types)s::text[]) AS t(type)),
done AS (
{done_last_hour}
),
newest_failed AS (
    SELECT f.finished_at, f.n
    FROM types t
    CROSS JOIN LATERAL (
        SELECT j.finished_at, row_number() OVER () AS n FROM (
            SELECT j.finished_at FROM {schema}.jobs j
            WHERE j.status = 'failed' AND j.type = t.type
            ORDER BY j.id DESC
            LIMIT %(failed_per_type)s
        ) j
    ) f
),
finished AS (
    SELECT 'done' AS status, finished_at FROM done
    UNION ALL
    SELECT 'failed', f.finished_at FROM newest_failed f, clock c
    WHERE f.finished_at > c.now - interval '1 hour' AND f.finished_at <= c.now
)
SELECT floor(extract(epoch FROM c.now - x.finished_at) / 60)::int AS minute,
       count(*) FILTER (WHERE x.status = 'done') AS done,
       count(*) FILTER (WHERE x.status = 'failed') AS failed,
       (SELECT count(*) > 0 FROM newest_failed f
        WHERE f.n = %(failed_per_type)s
          AND f.finished_at > c.now - interval '1 hour') AS failed_capped
FROM finished x, clock c
GROUP BY 1, c.now
ORDER BY 1
