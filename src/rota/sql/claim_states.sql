-- What became of jobs under these claims (docs/design.md, "Settling twice"): a row
-- still carrying the claim's token was last settled (or is still held) by that claim,
-- so its status tells a repeated complete, fail or defer what the first one did (done,
-- pending, failed) or that it is still running under the claim (a caller's transaction
-- that completed it did not commit). No row: the claim lost the job (reclaimed after a
-- stale lock, failed as stuck, postponed, pruned).
SELECT j.id, j.status
FROM {schema}.jobs j
JOIN unnest(%(ids)b::bigint[], %(claim_tokens)b::uuid[]) AS t(id, claim_token)
  ON t.id = j.id AND t.claim_token = j.claim_token
