-- A run pushed the due time of jobs it deferred or handed back to its budget's end, so
-- it would never claim them again; it ended sooner, so each is due when it asked again
-- (now, when that has passed or it asked for no time) (docs/design.md, "Defer").
-- Fenced by the pushed due time and the claim token the run left on the row (NULL for a
-- released job): a job claimed, moved or retried since is left alone.
-- Rows are locked in id order, whatever order the run pushed them in, like every batch
-- transition, so the restore cannot deadlock with claimers and sweepers.
WITH target AS (
    SELECT j.id, d.asked
    FROM {schema}.jobs j
    JOIN unnest(%(ids)b::bigint[], %(claim_tokens)b::uuid[], %(pushed)b::timestamptz[],
                %(asked)b::timestamptz[]) AS d(id, claim_token, pushed, asked)
      ON d.id = j.id
    WHERE j.status = 'pending'
      AND j.run_after = d.pushed
      AND j.claim_token IS NOT DISTINCT FROM d.claim_token
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE {schema}.jobs AS u
SET run_after = greatest(t.asked, now() + %(offset)s::interval)
FROM target t
WHERE u.id = t.id
