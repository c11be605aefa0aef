-- A run pushed the due time of jobs it deferred or handed back to its budget's end, so
-- it would never claim them again; it ended sooner, so each is due when it asked again
-- (now, when that has passed or it asked for no time) (docs/design.md, "Defer").
-- Fenced by the pushed due time and the claim token the run left on the row (NULL for a
-- released job): a job claimed, moved or retried since is left alone.
UPDATE {schema}.jobs AS u
SET run_after = greatest(d.asked, now() + %(offset)s::interval)
FROM unnest(%(ids)s::bigint[], %(claim_tokens)s::uuid[], %(pushed)s::timestamptz[],
            %(asked)s::timestamptz[]) AS d(id, claim_token, pushed, asked)
WHERE u.id = d.id
  AND u.status = 'pending'
  AND u.run_after = d.pushed
  AND u.claim_token IS NOT DISTINCT FROM d.claim_token
