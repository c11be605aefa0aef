-- Complete a job, only under the claim that holds it (a lost run matches nothing). The
-- claim's token stays on the done row, so a repeated complete under the same claim
-- (its first reply lost with the connection) is recognised by claim_states.sql as
-- "already done by this claim" (docs/design.md, "Settling twice").
UPDATE {schema}.jobs
SET status = 'done',
    finished_at = now() + %(offset)s::interval,
    locked_at = NULL
WHERE id = %(id)s AND status = 'running' AND claim_token = %(claim_token)s::uuid
RETURNING id
