-- A job's failed attempts' errors, oldest first, as a JSON array (NULL: none), for a
-- statement reading one job `j` (docs/design.md, "Results").
(SELECT jsonb_agg(jsonb_build_object(
            'attempt', e.attempt, 'error', e.error, 'error_type', e.error_type,
            'traceback', e.traceback,
            'run_id', e.run_id, 'started_at', e.started_at,
            'worker', (SELECT r.worker FROM {schema}.runs r WHERE r.id = e.run_id),
            'failed_at', e.failed_at) ORDER BY e.id)
 FROM {schema}.job_errors e
 WHERE e.job_id = j.id)
