-- queue.result (docs/design.md, "Results"): one job with its return value and every
-- failed attempt's error, oldest first.
SELECT j.*,
       (SELECT jsonb_agg(jsonb_build_object(
                   'attempt', e.attempt, 'error', e.error, 'error_type', e.error_type,
                   'traceback', e.traceback,
                   'run_id', e.run_id, 'started_at', e.started_at,
                   'failed_at', e.failed_at) ORDER BY e.id)
        FROM {schema}.job_errors e
        WHERE e.job_id = j.id) AS errors
FROM {schema}.jobs j
WHERE j.id = %(id)s
