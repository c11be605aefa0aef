-- Complete a job, only under the claim that holds it (a lost run matches nothing). The
-- claim's token stays on the done row, so a repeated complete under the same claim
-- (its first reply lost with the connection) is recognised by claim_states.sql as
-- "already done by this claim" (docs/design.md, "Settling twice"). The handler's return
-- value (JSON text, checked by the caller; null for none) and the attempt's claim time
-- are kept; a waiter on the job is told (docs/design.md, "Results"). The job's cost
-- becomes what it was charged (null: 1), replacing the expected cost it ran with
-- (docs/design.md, "Cost").
WITH done AS (
    UPDATE {schema}.jobs
    SET status = 'done',
        finished_at = now() + %(offset)s::interval,
        locked_at = NULL,
        result = %(result)s::jsonb,
        started_at = %(started_at)s::timestamptz,
        cost = coalesce(%(cost)s::numeric, 1)
    WHERE id = %(id)s AND status = 'running' AND claim_token = %(claim_token)s::uuid
    RETURNING id
), told AS (
    SELECT pg_notify('rota_settled', %(schema_name)s::text || ':' || d.id)
    FROM done d
    WHERE EXISTS (SELECT 1 FROM {schema}.job_waiters w WHERE w.job_id = d.id)
)
SELECT id FROM done WHERE (SELECT count(*) FROM told) >= 0
