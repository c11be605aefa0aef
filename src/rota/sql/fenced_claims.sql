-- Included by defer, heartbeat and release (the fenced_claims placeholder): the jobs of a batch that
-- the caller's claims still hold (docs/design.md, "Fencing"): running, with the claim
-- token the claim handed out. Rows are locked in id order, so batch transitions,
-- claimers and sweepers cannot deadlock.
-- The list drives the plan whatever the statistics say (docs/design.md, "Batch plans"):
-- each listed job is read and locked by its primary key, one probe per listed id in id
-- order (the LATERAL subquery's OFFSET 0 keeps it a probe, and keeps the status test out
-- of it, so no partial index of running jobs can stand in for the key); a job carrying
-- the token but no longer running (settled by this claim) is locked and left out. The
-- statements that include it take the rows by key from an array (one scan of jobs_pkey).
SELECT t.id
FROM (SELECT t.id, t.claim_token
      FROM unnest(%(ids)b::bigint[], %(claim_tokens)b::uuid[]) AS t(id, claim_token)
      ORDER BY t.id
      OFFSET 0) t
CROSS JOIN LATERAL (SELECT j.status FROM {schema}.jobs j
                    WHERE j.id = t.id AND j.claim_token = t.claim_token
                    OFFSET 0
                    FOR UPDATE) j
WHERE j.status = 'running'
