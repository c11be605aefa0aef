-- Batch enqueue in one statement (one round trip, no explicit transaction): the batch's
-- distinct groups are checked against the groups relation, and only when all are known
-- are the jobs inserted, in the order given; duplicates (against open jobs or inside the
-- batch) are skipped by the partial unique dedupe index. Returns how many jobs were
-- created and the unknown groups (the caller raises UnknownGroup for those).
WITH t AS (
    SELECT *
    FROM unnest(%(types)b::text[], %(group_ids)b::text[], %(payloads)b::text[]::jsonb[],
                %(dedupe_keys)b::text[], %(max_attempts)b::int[],
                %(run_afters)b::timestamptz[])
         WITH ORDINALITY AS t(type, group_id, payload, dedupe_key, max_attempts, run_after, n)
),
missing AS (
    SELECT d.group_id
    FROM (SELECT DISTINCT t.group_id FROM t WHERE t.group_id IS NOT NULL) d
    WHERE NOT EXISTS (SELECT 1 FROM {groups} g WHERE g.group_id = d.group_id)
),
created AS (
    INSERT INTO {schema}.jobs (type, group_id, payload, dedupe_key, max_attempts, run_after,
                               created_at)
    SELECT t.type, t.group_id, t.payload, t.dedupe_key, t.max_attempts,
           coalesce(t.run_after, now() + %(offset)s::interval),
           now() + %(offset)s::interval
    FROM t
    WHERE NOT EXISTS (SELECT 1 FROM missing)
    ORDER BY t.n
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM created)::int AS created,
       ARRAY(SELECT m.group_id FROM missing m ORDER BY m.group_id) AS missing
