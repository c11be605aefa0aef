-- Batch enqueue: one INSERT over parallel arrays; duplicates (against open jobs or
-- inside the batch) are skipped by the partial unique dedupe index. Groups are
-- checked with MISSING_GROUPS first, in the same transaction.
INSERT INTO {schema}.jobs (type, group_id, payload, dedupe_key, max_attempts, run_after, created_at)
SELECT t.type, t.group_id, t.payload, t.dedupe_key, t.max_attempts,
       coalesce(t.run_after, now() + %(offset)s::interval),
       now() + %(offset)s::interval
FROM unnest(%(types)b::text[], %(group_ids)b::text[], %(payloads)b::text[]::jsonb[],
            %(dedupe_keys)b::text[], %(max_attempts)b::int[], %(run_afters)b::timestamptz[])
     WITH ORDINALITY AS t(type, group_id, payload, dedupe_key, max_attempts, run_after, n)
ORDER BY t.n
ON CONFLICT DO NOTHING
