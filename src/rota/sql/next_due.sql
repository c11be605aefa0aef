-- The worker's alarm clock: seconds until the earliest job of these types (NULL: any
-- type) could be claimed (zero or negative: now), or NULL when none is waiting. A pending
-- job is due at run_after; a running job with attempts left is due again when its lock
-- goes stale (docs/design.md, "Stale locks"). Jobs of paused groups are left out, as the claim leaves them.
SELECT extract(epoch FROM min(x.due) - (now() + %(offset)s::interval))::float8 AS due_in
FROM (
    SELECT j.run_after AS due
    FROM {schema}.jobs j
    LEFT JOIN {groups} g ON g.group_id = j.group_id
    WHERE j.status = 'pending'
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND coalesce(g.active, true)
    UNION ALL
    SELECT greatest(j.run_after, j.locked_at + %(stale_after)s::interval) AS due
    FROM {schema}.jobs j
    LEFT JOIN {groups} g ON g.group_id = j.group_id
    WHERE j.status = 'running'
      AND j.attempts < j.max_attempts
      AND (%(types)s::text[] IS NULL OR j.type = ANY(%(types)s::text[]))
      AND coalesce(g.active, true)
) x
