-- Hand claimed jobs back untouched (a runner's prefetched batch that its run will not
-- start): pending again with the claim undone (its attempt returned, lock and claim
-- token cleared), the due time kept, no deferral counted. Fenced by claim token; rows
-- locked in id order like every batch transition.
WITH target AS (
    SELECT j.id
    FROM {schema}.jobs j
    JOIN unnest(%(ids)s::bigint[], %(claim_tokens)s::uuid[]) AS t(id, claim_token)
      ON t.id = j.id AND t.claim_token = j.claim_token
    WHERE j.status = 'running'
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE {schema}.jobs AS u
SET status = 'pending',
    attempts = greatest(u.attempts - 1, 0),
    locked_at = NULL,
    claim_token = NULL
FROM target
WHERE u.id = target.id
RETURNING u.id
