-- Failed jobs whose give-up hook has not run yet, for the types this process has hooks for.
SELECT id FROM {schema}.jobs
WHERE give_up_pending AND type = ANY(%(types)s::text[])
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
ORDER BY id
LIMIT %(limit)s
