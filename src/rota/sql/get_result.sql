-- queue.result (docs/design.md, "Results"): one job with its return value and every
-- failed attempt's error, oldest first.
SELECT j.*,
       {job_errors} AS errors
FROM {schema}.jobs j
WHERE j.id = %(id)s
