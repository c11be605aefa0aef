-- Dashboard: one run (as on `/runs`), for its own page.
SELECT id, trigger, stop_reason, jobs_done, jobs_failed, jobs_deferred, quota_units,
       summary, error, started_at, finished_at, heartbeat_at, worker,
       extract(epoch FROM coalesce(finished_at, now() + %(offset)s::interval) - started_at)
         ::float8 AS seconds
FROM {schema}.runs
WHERE id = %(id)s
