-- Included by defer, heartbeat and release (the fenced_claims placeholder): the jobs of a batch that
-- the caller's claims still hold (docs/design.md, "Fencing"): running, with the claim
-- token the claim handed out. Rows are locked in id order, so batch transitions,
-- claimers and sweepers cannot deadlock.
SELECT j.id
FROM {schema}.jobs j
JOIN unnest(%(ids)b::bigint[], %(claim_tokens)b::uuid[]) AS t(id, claim_token)
  ON t.id = j.id AND t.claim_token = j.claim_token
WHERE j.status = 'running'
ORDER BY j.id
FOR UPDATE OF j
