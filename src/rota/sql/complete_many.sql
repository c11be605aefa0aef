-- Complete a batch of jobs, each only under the claim that holds it (a lost one matches
-- nothing); the claims' tokens stay on the done rows, as in complete.sql, and so do
-- their return values and claim times. Rows are locked in the order given (the caller
-- sorts them by id, the one order of every statement that locks several jobs). One
-- notification for the whole batch tells waiters which of their jobs settled ("*":
-- too many to list, look again), sent only when a job of the batch has one
-- (docs/design.md, "Results"). Each job's cost becomes what it was charged (null: 1),
-- as in complete.sql.
--
-- The list drives the plan whatever the statistics say (docs/design.md, "Batch plans"):
-- `held` reads and locks each listed job by its primary key, one probe per listed id
-- (the LATERAL subquery's OFFSET 0 keeps it a probe, and keeps the status test out of
-- it, so no partial index of running jobs can stand in for the key), then the update
-- takes the held rows by key from an array (one scan of jobs_pkey) and each row's values
-- from the arrays by its place among the sorted ids (width_bucket, a binary search).
-- Joined to the list with `j.status = 'running'`, the update read every running job
-- through jobs_running_idx on statistics taken when few ran, one cost tie from
-- rescanning the whole list per running job: 1,000 jobs took 250 ms instead of 20
-- (999,000 rows removed by the join filter), 2,000 took 1.1 s.
-- The fence is tested on the locked row (under READ COMMITTED, as it is now), so a job
-- settled or reclaimed since the statement began is left alone.
WITH held AS MATERIALIZED (
    SELECT c.id, c.result, c.started_at, c.cost
    FROM unnest(%(ids)b::bigint[], %(claim_tokens)b::uuid[], %(results)b::text[],
                %(started_ats)b::timestamptz[], %(costs)b::numeric[])
         AS c(id, claim_token, result, started_at, cost)
    CROSS JOIN LATERAL (SELECT j.status FROM {schema}.jobs j
                        WHERE j.id = c.id AND j.claim_token = c.claim_token
                        OFFSET 0
                        FOR UPDATE) j
    WHERE j.status = 'running'
), batch AS (
    SELECT array_agg(h.id ORDER BY h.id) AS ids,
           array_agg(h.result ORDER BY h.id) AS results,
           array_agg(h.started_at ORDER BY h.id) AS started_ats,
           array_agg(h.cost ORDER BY h.id) AS costs
    FROM held h
), done AS (
    UPDATE {schema}.jobs j
    SET status = 'done',
        finished_at = now() + %(offset)s::interval,
        locked_at = NULL,
        result = b.results[width_bucket(j.id, b.ids)]::jsonb,
        started_at = b.started_ats[width_bucket(j.id, b.ids)],
        cost = coalesce(b.costs[width_bucket(j.id, b.ids)], 1)
    FROM batch b
    WHERE j.id = ANY (b.ids)
    RETURNING j.id, j.claim_token
), told AS (
    SELECT pg_notify('rota_settled', %(schema_name)s::text || ':'
                     || CASE WHEN count(*) <= 300 THEN string_agg(d.id::text, ',' ORDER BY d.id)
                             ELSE '*' END)
    FROM done d
    -- Asked once (an initplan) before a probe per job: most batches have no waiter.
    WHERE EXISTS (SELECT 1 FROM {schema}.job_waiters)
      AND EXISTS (SELECT 1 FROM {schema}.job_waiters w WHERE w.job_id = d.id)
    HAVING count(*) > 0
)
-- Each job done now with the claim it was done under: the same job may be listed under
-- two claims (one lost, one holding it), and only the holding one's completion is its.
SELECT id, claim_token FROM done WHERE (SELECT count(*) FROM told) >= 0
