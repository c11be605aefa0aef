-- `rota runs`: the last runs, newest first, with why each stopped.
SELECT id, trigger, stop_reason, jobs_done, jobs_failed, jobs_deferred, quota_units,
       summary, error, started_at, finished_at
FROM {schema}.runs
ORDER BY started_at DESC, id
LIMIT %(limit)s
