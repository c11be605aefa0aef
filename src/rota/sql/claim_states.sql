-- What became of jobs under these claims (docs/design.md, "Settling twice"): a row
-- still carrying the claim's token was last settled (or is still held) by that claim,
-- so its status tells a repeated complete, fail or defer what the first one did (done,
-- pending, failed) or that it is still running under the claim (a caller's transaction
-- that completed it did not commit). No row: the claim lost the job (reclaimed after a
-- stale lock, failed as stuck, postponed, pruned).
-- One primary-key probe per listed id whatever the statistics say (docs/design.md,
-- "Batch plans"): the LATERAL subquery's OFFSET 0 keeps the list driving.
SELECT t.id, t.claim_token, j.status
FROM unnest(%(ids)b::bigint[], %(claim_tokens)b::uuid[]) AS t(id, claim_token)
CROSS JOIN LATERAL (SELECT j.status FROM {schema}.jobs j
                    WHERE j.id = t.id AND j.claim_token = t.claim_token
                    OFFSET 0) j
