-- Enqueue one job without a dedupe key into rota's own groups table (the usual enqueue)
-- as one INSERT, with this queue's settings (s_*): the rules of enqueue_jobs
-- (enqueue_rule), its group check and its defaults, without the function's call, its
-- argument arrays and its result set, which cost about a tenth of a single enqueue's
-- time in the database (bench/RESULTS.md, section 32). The job is written only when it
-- breaks no rule and its group exists. No row: nothing was written, and the caller runs
-- sql/enqueue.sql, whose enqueue_jobs says what was wrong (docs/design.md, "Enqueue").
-- tests/test_enqueue_statement.py holds this statement to enqueue_jobs' rows.
INSERT INTO {schema}.jobs AS j (type, group_id, payload, max_attempts, run_after,
                                created_at, trace_context)
SELECT t.type, t.group_id, t.payload,
       coalesce(t.max_attempts, (t.by_type ->> t.type)::integer, t.max_attempts_default),
       coalesce(t.run_after, now() + t.clock_offset), now() + t.clock_offset,
       nullif(t.trace_context, 'null'::jsonb)
FROM (SELECT %(type)s::text AS type, %(payload)s::jsonb AS payload,
             %(group_id)s::text AS group_id, %(run_after)s::timestamptz AS run_after,
             %(max_attempts)s::integer AS max_attempts,
             %(trace_context)s::jsonb AS trace_context,
             %(s_max_attempts_by_type)s::jsonb AS by_type,
             %(s_max_attempts)s::integer AS max_attempts_default,
             %(offset)s::interval AS clock_offset) t
WHERE {schema}.enqueue_rule(t.type, t.payload, t.group_id, NULL, t.run_after,
                            t.max_attempts, t.trace_context, %(s_types)s::text[],
                            %(s_max_payload_bytes)s::integer) IS NULL
  AND (t.group_id IS NULL
       OR EXISTS (SELECT 1 FROM {schema}.groups g WHERE g.group_id = t.group_id))
-- As enqueue_jobs: a row whose id is taken is skipped, not raised.
ON CONFLICT DO NOTHING
RETURNING NULL::jsonb AS problem, j.*
