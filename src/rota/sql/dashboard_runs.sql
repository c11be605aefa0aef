-- Dashboard `/runs`: runs newest first, a page at a time: keyset on (started_at, id)
-- below the last row shown (NULLs: the first page), read backwards from
-- runs_started_idx.
SELECT id, trigger, stop_reason, jobs_done, jobs_failed, jobs_deferred, quota_units,
       summary, error, started_at, finished_at, heartbeat_at,
       extract(epoch FROM coalesce(finished_at, now() + %(offset)s::interval) - started_at)
         ::float8 AS seconds
FROM {schema}.runs
WHERE %(before_started)s::timestamptz IS NULL
   OR started_at < %(before_started)s::timestamptz
   OR (started_at = %(before_started)s::timestamptz AND id < %(before_id)s::uuid)
ORDER BY started_at DESC, id DESC
LIMIT %(limit)s
