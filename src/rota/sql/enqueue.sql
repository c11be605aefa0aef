-- Enqueue one job through the rules of enqueue_jobs (docs/design.md, "Enqueue") with this
-- queue's settings (s_*): the job created; no row for a duplicate of an open job (the
-- partial unique index on dedupe_key decides, ON CONFLICT DO NOTHING); or, with nothing
-- written, a row whose problem says what was wrong (the caller raises it, and its
-- transaction stays usable). trace_context: the enqueueing span's W3C Trace Context, or
-- null (rota.tracing).
SELECT e.problem, (e.job).*
FROM {schema}.enqueue_jobs(
    ARRAY[%(type)s::text], ARRAY[%(payload)s::jsonb], ARRAY[%(group_id)s::text],
    ARRAY[%(dedupe_key)s::text], ARRAY[%(run_after)s::timestamptz],
    ARRAY[%(max_attempts)s::integer], false,
    %(s_types)s::text[], %(s_max_attempts)s::integer, %(s_max_attempts_by_type)s::jsonb,
    %(s_max_payload_bytes)s::integer, %(s_groups)s::regclass, %(offset)s::interval,
    ARRAY[%(trace_context)s::jsonb]) AS e
