-- Stuck jobs (docs/design.md, "Stuck jobs"): running, lock stale, attempts used up. Nobody will ever
-- reclaim them, so they are failed here and their give-up hooks become owed.
-- SKIP LOCKED: a row a live transaction holds is not stale for this sweep; id order
-- keeps concurrent sweepers from deadlocking. The last attempt's error is kept with the
-- others and their waiters are told (docs/design.md, "Results").
WITH stuck AS (
    SELECT id
    FROM {schema}.jobs
    WHERE status = 'running'
      AND locked_at < now() + %(offset)s::interval - %(stale_after)s::interval
      AND attempts >= max_attempts
    ORDER BY id
    FOR UPDATE SKIP LOCKED
), failed AS (
    UPDATE {schema}.jobs AS u
    SET {failed_now},
        last_error = 'stuck: lock went stale on the last attempt (the process running it died)'
    FROM stuck
    WHERE u.id = stuck.id
    RETURNING u.*
), kept AS (
    INSERT INTO {schema}.job_errors (job_id, attempt, run_id, failed_at, error)
    SELECT f.id, f.attempts, f.run_id, f.finished_at, f.last_error
    FROM failed f
    ORDER BY f.id
), told AS (
    SELECT pg_notify('rota_settled', %(schema_name)s::text || ':*')
    FROM failed f
    WHERE EXISTS (SELECT 1 FROM {schema}.job_waiters w WHERE w.job_id = f.id)
    HAVING count(*) > 0
)
SELECT * FROM failed WHERE (SELECT count(*) FROM told) >= 0
