-- Complete a batch of jobs, each only under the claim that holds it (a lost one matches
-- nothing); the claims' tokens stay on the done rows, as in complete.sql. Rows are
-- visited in the order given (the caller sorts them by id, the one order of every
-- statement that locks several jobs).
UPDATE {schema}.jobs j
SET status = 'done',
    finished_at = now() + %(offset)s::interval,
    locked_at = NULL
FROM (SELECT c.id, c.claim_token
      FROM unnest(%(ids)s::bigint[], %(claim_tokens)s::uuid[]) WITH ORDINALITY
           AS c(id, claim_token, n)
      ORDER BY c.n
      OFFSET 0) c
WHERE j.id = c.id AND j.status = 'running' AND j.claim_token = c.claim_token
RETURNING j.id
