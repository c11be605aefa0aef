-- Batch enqueue in one statement through the rules of enqueue_jobs (docs/design.md,
-- "Enqueue"), with this queue's settings (s_*): jobs are inserted in the order given,
-- duplicates (of open jobs or inside the batch) skipped. Returns how many were created
-- and, when the input breaks a rule (nothing written), the problem to raise. Every job
-- carries trace_context, the W3C Trace Context of the batch's span, or null (rota.tracing).
SELECT count(*) FILTER (WHERE e.problem IS NULL)::int AS created,
       jsonb_agg(e.problem) FILTER (WHERE e.problem IS NOT NULL) -> 0 AS problem
FROM {schema}.enqueue_jobs(
    %(types)b::text[], %(payloads)b::text[]::jsonb[], %(group_ids)b::text[],
    %(dedupe_keys)b::text[], %(run_afters)b::timestamptz[], %(max_attempts)b::integer[],
    true,
    %(s_types)s::text[], %(s_max_attempts)s::integer, %(s_max_attempts_by_type)s::jsonb,
    %(s_max_payload_bytes)s::integer, %(s_groups)s::regclass, %(offset)s::interval,
    array_fill(%(trace_context)s::jsonb, ARRAY[%(count)s::integer])) AS e
