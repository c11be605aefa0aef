-- admin.retry_job (`rota jobs retry ID`): a failed job goes back to pending, due now,
-- with attempts and deferrals reset, as if newly enqueued; last_error is kept as history.
-- Guards: only a failed job; not while another open job holds its dedupe key (the
-- open-jobs unique index would refuse it anyway).
-- A give-up hook still owed is cancelled (give_up_pending cleared): the job has not
-- given up any more; if it fails again, its hook is owed again and runs once then.
-- `hook_cancelled` tells the caller. A hook running right now holds the row lock, so
-- this waits for it and then finds nothing owed.
-- pg_notify wakes sleeping workers, as the insert trigger does for new jobs.
WITH target AS (
    SELECT j.id, j.give_up_pending
    FROM {schema}.jobs j
    WHERE j.id = %(id)s
      AND j.status = 'failed'
      AND (j.dedupe_key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {schema}.jobs o
            WHERE o.dedupe_key = j.dedupe_key AND o.status IN ('pending', 'running')))
    FOR UPDATE OF j
),
retried AS (
    UPDATE {schema}.jobs AS u
    SET status = 'pending',
        attempts = 0,
        deferrals = 0,
        run_after = now() + %(offset)s::interval,
        finished_at = NULL,
        locked_at = NULL,
        claim_token = NULL,
        give_up_pending = false
    FROM target t
    WHERE u.id = t.id AND u.status = 'failed'
    RETURNING u.*, t.give_up_pending AS hook_cancelled
)
SELECT r.*, pg_notify(%(channel)s, 'retry') IS NULL AS notified
FROM retried r
