-- A stage whose rate limit has no units before the run's budget ends: its pending jobs
-- due sooner wait for the units as pending (run_after is the one mechanism for waiting;
-- never claimed, so attempts and deferrals are untouched), so a worker sleeps until
-- then rather than claiming them to defer them. Rows a claimer holds are skipped; id
-- order keeps this from deadlocking with batch deferrals.
WITH blocked AS (
    SELECT id
    FROM {schema}.jobs
    WHERE type = %(type)s AND status = 'pending' AND run_after < %(until)s
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs AS u
SET run_after = %(until)s
FROM blocked
WHERE u.id = blocked.id
