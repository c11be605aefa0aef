-- Hand claimed jobs back untouched (a batch, or a prefetched one, that the run ends
-- before starting; a job whose handler could not get a connection): pending again
-- with the claim undone (its attempt returned, lock and claim token cleared), no
-- deferral counted, the due time kept, or moved to not_before when later (a run never
-- claims again what it handed back). Fenced by claim token; rows locked in id order
-- like every batch transition.
WITH target AS MATERIALIZED (
{fenced_claims}
)
UPDATE {schema}.jobs AS u
SET status = 'pending',
    attempts = greatest(u.attempts - 1, 0),
    run_after = greatest(u.run_after, coalesce(%(not_before)s::timestamptz, u.run_after)),
    locked_at = NULL,
    claim_token = NULL
WHERE u.id = ANY (ARRAY(SELECT x.id FROM target x))
RETURNING u.id
