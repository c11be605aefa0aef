-- Dashboard: the job types present, by a loose index scan of each status's partial
-- index (a few index probes per type, whatever the number of jobs; DISTINCT over the
-- table would read every row).
WITH RECURSIVE
pending(type) AS (
    SELECT min(type) FROM {schema}.jobs WHERE status = 'pending'
    UNION ALL
    SELECT (SELECT min(j.type) FROM {schema}.jobs j
            WHERE j.status = 'pending' AND j.type > p.type)
    FROM pending p WHERE p.type IS NOT NULL
),
running(type) AS (
    SELECT min(type) FROM {schema}.jobs WHERE status = 'running'
    UNION ALL
    SELECT (SELECT min(j.type) FROM {schema}.jobs j
            WHERE j.status = 'running' AND j.type > r.type)
    FROM running r WHERE r.type IS NOT NULL
),
done(type) AS (
    SELECT min(type) FROM {schema}.jobs WHERE status = 'done'
    UNION ALL
    SELECT (SELECT min(j.type) FROM {schema}.jobs j
            WHERE j.status = 'done' AND j.type > d.type)
    FROM done d WHERE d.type IS NOT NULL
),
failed(type) AS (
    SELECT min(type) FROM {schema}.jobs WHERE status = 'failed'
    UNION ALL
    SELECT (SELECT min(j.type) FROM {schema}.jobs j
            WHERE j.status = 'failed' AND j.type > f.type)
    FROM failed f WHERE f.type IS NOT NULL
)
SELECT type FROM pending WHERE type IS NOT NULL
UNION SELECT type FROM running WHERE type IS NOT NULL
UNION SELECT type FROM done WHERE type IS NOT NULL
UNION SELECT type FROM failed WHERE type IS NOT NULL
ORDER BY type
