-- Hand claimed jobs back untouched (a runner's prefetched batch that its run will not
-- start): pending again with the claim undone (its attempt returned, lock and claim
-- token cleared), the due time kept, no deferral counted. Fenced by claim token; rows
-- locked in id order like every batch transition.
WITH target AS (
{fenced_claims}
)
UPDATE {schema}.jobs AS u
SET status = 'pending',
    attempts = greatest(u.attempts - 1, 0),
    locked_at = NULL,
    claim_token = NULL
FROM target
WHERE u.id = target.id
RETURNING u.id
