-- Publish this queue's settings for the SQL entry points enqueue and enqueue_many
-- (docs/enqueue-from-sql.md, "Settings"). The groups relation is recorded
-- schema-qualified, as this session resolves it, since the functions resolve it under a
-- fixed search_path. Writes nothing when the row already holds these settings.
INSERT INTO {schema}.enqueue_settings AS s
    (one, types, max_attempts, max_attempts_by_type, max_payload_bytes, groups,
     clock_offset, published_at)
SELECT true, %(s_types)s::text[], %(s_max_attempts)s::integer,
       %(s_max_attempts_by_type)s::jsonb, %(s_max_payload_bytes)s::integer,
       coalesce((SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
                 FROM pg_catalog.pg_class c
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                 WHERE c.oid = to_regclass(%(s_groups)s::text)),
                %(s_groups)s::text),
       %(offset)s::interval, now()
ON CONFLICT (one) DO UPDATE
SET types = excluded.types, max_attempts = excluded.max_attempts,
    max_attempts_by_type = excluded.max_attempts_by_type,
    max_payload_bytes = excluded.max_payload_bytes, groups = excluded.groups,
    clock_offset = excluded.clock_offset, published_at = excluded.published_at
WHERE (s.types, s.max_attempts, s.max_attempts_by_type, s.max_payload_bytes, s.groups,
       s.clock_offset)
      IS DISTINCT FROM (excluded.types, excluded.max_attempts,
                        excluded.max_attempts_by_type, excluded.max_payload_bytes,
                        excluded.groups, excluded.clock_offset)
