-- A stage blocked by its quota: its claimable jobs cannot proceed before the quota
-- resets, so they wait for it (run_after is the one mechanism for waiting):
--   * pending jobs due before the reset: never claimed, so attempts and deferrals are
--     untouched;
--   * running jobs whose lock went stale with attempts left (their process died): the
--     claim would hand them out again, but no run claims this type until the reset, so
--     they would stay `running` with a dead lock all that time. They go back to pending
--     at the reset, as a reclaim followed by a deferral would leave them, except that
--     the lost attempt stays counted (a crash counts, as for any reclaim) and no
--     deferral is recorded. Clearing claim_token fences the lost claim, as a reclaim's
--     new token does. Stuck jobs (attempts used up) are left for fail_stuck_jobs.
-- Rows a claimer holds are skipped; id order keeps this from deadlocking with batch
-- deferrals.
WITH blocked AS (
    SELECT id
    FROM {schema}.jobs
    WHERE type = %(type)s
      AND ((status = 'pending' AND run_after < %(until)s)
           OR (status = 'running'
               AND locked_at < now() + %(offset)s::interval - %(stale_after)s::interval
               AND attempts < max_attempts))
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS u
SET status = 'pending',
    run_after = greatest(u.run_after, %(until)s),
    locked_at = NULL,
    claim_token = NULL
FROM blocked
WHERE u.id = blocked.id
