-- A stage blocked by its quota: its pending jobs cannot proceed before the quota resets,
-- so they wait for it (run_after is the one mechanism for waiting). They were never
-- claimed, so attempts and deferrals are untouched. Rows a claimer holds are skipped;
-- id order keeps this from deadlocking with batch deferrals.
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
