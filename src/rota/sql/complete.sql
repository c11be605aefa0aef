-- Complete a job, only under the claim that holds it (a lost run matches nothing).
UPDATE {schema}.jobs
SET status = 'done',
    finished_at = now() + %(offset)s::interval,
    locked_at = NULL,
    claim_token = NULL
WHERE id = %(id)s AND status = 'running' AND claim_token = %(claim_token)s::uuid
RETURNING id
