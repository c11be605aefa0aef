-- Enqueue one job (docs/design.md, "Enqueue"): the partial unique index on open jobs' dedupe_key
-- decides what a duplicate is, so a conflict is skipped, never queried for beforehand.
-- A job for a group the groups relation does not know is not inserted (the caller
-- tells that apart from a duplicate with MISSING_GROUPS).
INSERT INTO {schema}.jobs (type, group_id, payload, dedupe_key, max_attempts, run_after, created_at)
SELECT %(type)s, %(group_id)s::text, %(payload)s::jsonb, %(dedupe_key)s, %(max_attempts)s,
       coalesce(%(run_after)s::timestamptz, now() + %(offset)s::interval),
       now() + %(offset)s::interval
WHERE %(group_id)s::text IS NULL
   OR EXISTS (SELECT 1 FROM {groups} g WHERE g.group_id = %(group_id)s::text)
ON CONFLICT DO NOTHING
RETURNING *
