-- Complete a batch of jobs, each only under the claim that holds it (a lost one matches
-- nothing); the claims' tokens stay on the done rows, as in complete.sql, and so do
-- their return values and claim times. Rows are visited in the order given (the caller
-- sorts them by id, the one order of every statement that locks several jobs). One
-- notification for the whole batch tells waiters which of their jobs settled ("*":
-- too many to list, look again), sent only when a job of the batch has one
-- (docs/design.md, "Results"). Each job's cost becomes what it was charged (null: 1),
-- as in complete.sql.
WITH done AS (
    UPDATE {schema}.jobs j
    SET status = 'done',
        finished_at = now() + %(offset)s::interval,
        locked_at = NULL,
        result = c.result::jsonb,
        started_at = c.started_at,
        cost = coalesce(c.cost, 1)
    FROM (SELECT c.id, c.claim_token, c.result, c.started_at, c.cost
          FROM unnest(%(ids)b::bigint[], %(claim_tokens)b::uuid[], %(results)b::text[],
                      %(started_ats)b::timestamptz[], %(costs)b::numeric[]) WITH ORDINALITY
               AS c(id, claim_token, result, started_at, cost, n)
          ORDER BY c.n
          OFFSET 0) c
    WHERE j.id = c.id AND j.status = 'running' AND j.claim_token = c.claim_token
    RETURNING j.id
), told AS (
    SELECT pg_notify('rota_settled', %(schema_name)s::text || ':'
                     || CASE WHEN count(*) <= 300 THEN string_agg(d.id::text, ',')
                             ELSE '*' END)
    FROM done d
    -- Asked once (an initplan) before a probe per job: most batches have no waiter.
    WHERE EXISTS (SELECT 1 FROM {schema}.job_waiters)
      AND EXISTS (SELECT 1 FROM {schema}.job_waiters w WHERE w.job_id = d.id)
    HAVING count(*) > 0
)
SELECT id FROM done WHERE (SELECT count(*) FROM told) >= 0
