-- Stuck jobs (docs/design.md, "Stuck jobs"): running, lock stale, attempts used up. Nobody will ever
-- reclaim them, so they are failed here and their give-up hooks become owed.
-- SKIP LOCKED: a row a live transaction holds is not stale for this sweep; id order
-- keeps concurrent sweepers from deadlocking.
WITH stuck AS (
    SELECT id
    FROM {schema}.jobs
    WHERE status = 'running'
      AND locked_at < now() + %(offset)s::interval - %(stale_after)s::interval
      AND attempts >= max_attempts
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS u
SET {failed_now},
    last_error = 'stuck: lock went stale on the last attempt (the process running it died)'
FROM stuck
WHERE u.id = stuck.id
RETURNING u.*
