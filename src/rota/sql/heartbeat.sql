-- A live run refreshes locked_at of the jobs it holds, well inside the stale window, so
-- only a dead run's jobs ever look stale ("the stale window is safe by construction").
-- Fenced by the claim: a job this run lost is not touched. Rows locked in id order.
WITH held AS MATERIALIZED (
{fenced_claims}
)
UPDATE {schema}.jobs AS u
SET locked_at = now() + %(offset)s::interval
WHERE u.id = ANY (ARRAY(SELECT x.id FROM held x))
RETURNING u.id
