-- A run pushed the due time of jobs it deferred or handed back to its budget's end, so
-- it would never claim them again; it ended sooner, so each is due when it asked again
-- (now, when that has passed or it asked for no time) (docs/design.md, "Defer").
-- Fenced by the pushed due time and the claim token the run left on the row (NULL for a
-- released job): a job claimed, moved or retried since is left alone.
-- Rows are locked in id order, whatever order the run pushed them in, like every batch
-- transition, so the restore cannot deadlock with claimers and sweepers.
-- The list drives the plan whatever the statistics say (docs/design.md, "Batch plans"):
-- each listed job is read and locked by its primary key (the LATERAL subquery's OFFSET 0
-- keeps it a probe, and keeps the status test out of it, so no partial index of pending
-- jobs can stand in for the key); the update takes the rows by key from an array, and
-- each row's asked time from the arrays by its place among the sorted ids (width_bucket,
-- a binary search).
WITH target AS MATERIALIZED (
    SELECT d.id, d.asked
    FROM (SELECT d.id, d.claim_token, d.pushed, d.asked
          FROM unnest(%(ids)b::bigint[], %(claim_tokens)b::uuid[],
                      %(pushed)b::timestamptz[], %(asked)b::timestamptz[])
               AS d(id, claim_token, pushed, asked)
          ORDER BY d.id
          OFFSET 0) d
    CROSS JOIN LATERAL (SELECT j.status FROM {schema}.jobs j
                        WHERE j.id = d.id
                          AND j.run_after = d.pushed
                          AND j.claim_token IS NOT DISTINCT FROM d.claim_token
                        OFFSET 0
                        FOR UPDATE) j
    WHERE j.status = 'pending'
), batch AS (
    SELECT array_agg(t.id ORDER BY t.id) AS ids, array_agg(t.asked ORDER BY t.id) AS asked
    FROM target t
)
UPDATE {schema}.jobs AS u
SET run_after = greatest(b.asked[width_bucket(u.id, b.ids)], now() + %(offset)s::interval)
FROM batch b
WHERE u.id = ANY (b.ids)
