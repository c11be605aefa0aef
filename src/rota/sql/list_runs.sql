-- admin.list_runs (`rota runs`): runs newest first, with why each stopped. Keyset
-- pagination: only runs after (before_at, before_id) in this order, the last run of the
-- previous page; with the zero UUID as before_id, only runs started before before_at.
SELECT id, trigger, stop_reason, jobs_done, jobs_failed, jobs_deferred, quota_units,
       summary, error, started_at, finished_at
FROM {schema}.runs
WHERE %(before_at)s::timestamptz IS NULL
   OR (started_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid)
ORDER BY started_at DESC, id DESC
LIMIT %(limit)s
