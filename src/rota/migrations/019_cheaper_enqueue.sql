-- A cheaper enqueue (docs/design.md, "Enqueue"; bench/RESULTS.md, section 20): the same
-- rules, errors, dedupe and rows as before, in fewer statements. enqueue_rule holds the
-- rules of enqueue_jobs' CASE (unchanged) as one expression the planner inlines, so that
-- a single job without a dedupe key, into rota's groups table, is checked, its group
-- looked up and the job inserted in one statement; a batch, a job with a dedupe key, a
-- bad job, an unknown group and an application's groups relation take the three steps
-- as before. fair_jobs_insert's usual case (every job pending, due now, in a group
-- whose row bounds it: only the shared row locks to take) is one statement over the
-- transition table instead of two, with plain aggregates per group instead of sorted
-- arrays; the head-bound protocol is unchanged (docs/fast-claim.md). Only function
-- bodies change, and one function is added. The schema placeholder is replaced by the
-- quoted schema name, and doubled braces by single ones.

-- The first rule of enqueue a job breaks (docs/design.md, "Enqueue"), as column:rule, in
-- the order Python checks its arguments; null when it breaks none. The rules once, for
-- enqueue_jobs' two paths; a SQL function of one expression, so the planner inlines it
-- into the statement that calls it (no call per job).
CREATE FUNCTION {schema}.enqueue_rule(
    p_type text, p_payload jsonb, p_group_id text, p_dedupe_key text,
    p_run_after timestamptz, p_max_attempts integer, p_trace_context jsonb,
    s_types text[], s_max_payload_bytes integer
) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE
        -- Short names (rota.checks.require_text): at most 512 UTF-8 bytes keeps every
        -- key well inside a btree index row.
        WHEN p_type IS NULL OR p_type = '' THEN 'type:empty'
        WHEN octet_length(p_type) > 512 THEN 'type:long'
        WHEN NOT p_type = ANY (s_types) THEN 'type:undeclared'
        WHEN p_payload IS NULL THEN 'payload:null'
        -- The size of the payload's JSON text as PostgreSQL prints it.
        WHEN octet_length(p_payload::text) > s_max_payload_bytes THEN 'payload:large'
        -- Workers decode payloads recursively (Python's json stops near 1,000
        -- levels): no value may lie more than 256 arrays and objects down.
        WHEN jsonb_path_exists(p_payload, 'strict $.**{{257}}') THEN 'payload:deep'
        WHEN p_group_id = '' THEN 'group_id:empty'
        WHEN octet_length(p_group_id) > 512 THEN 'group_id:long'
        WHEN p_dedupe_key = '' THEN 'dedupe_key:empty'
        WHEN octet_length(p_dedupe_key) > 512 THEN 'dedupe_key:long'
        -- Due times must load back in any session time zone
        -- (rota.checks.require_due_time).
        WHEN NOT p_run_after BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'
            THEN 'run_after:range'
        WHEN p_max_attempts < 1 THEN 'max_attempts:low'
        -- A W3C Trace Context carrier: traceparent (version-trace id-parent id-flags)
        -- and optionally tracestate, which W3C lets a carrier cut at 512 bytes.
        WHEN p_trace_context IS NOT NULL AND p_trace_context <> 'null'::jsonb AND NOT (
                jsonb_typeof(p_trace_context) = 'object'
                AND p_trace_context - ARRAY['traceparent', 'tracestate'] = '{{}}'::jsonb
                -- Required: without it the test above would be null, and NOT
                -- (null) let '{{}}' through (docs/enqueue-from-sql.md).
                AND coalesce(jsonb_typeof(p_trace_context -> 'traceparent'), '')
                    = 'string'
                AND p_trace_context ->> 'traceparent'
                    ~ '^[0-9a-f]{{2}}-[0-9a-f]{{32}}-[0-9a-f]{{16}}-[0-9a-f]{{2}}$'
                AND coalesce(jsonb_typeof(p_trace_context -> 'tracestate'), 'string')
                    = 'string'
                AND octet_length(coalesce(p_trace_context ->> 'tracestate', '')) <= 512)
            THEN 'trace_context:invalid'
    END
$$;

-- enqueue_jobs (migration 004, restated by 009 and 016): the single-job statement first,
-- and the rules through enqueue_rule.
CREATE OR REPLACE FUNCTION {schema}.enqueue_jobs(
    p_types text[], p_payloads jsonb[], p_group_ids text[], p_dedupe_keys text[],
    p_run_afters timestamptz[], p_max_attempts integer[],
    p_name_items boolean,  -- prefix problems with "item N: " (N from 0)
    s_types text[], s_max_attempts integer, s_max_attempts_by_type jsonb,
    s_max_payload_bytes integer, s_groups regclass, s_clock_offset interval,
    -- W3C Trace Context per job ({{"traceparent": …, "tracestate": …}}), or null for
    -- none (docs/operations.md, "Traces"); defaulted, so callers of the signature
    -- before it keep working.
    p_trace_contexts jsonb[] DEFAULT NULL,
    OUT job {schema}.jobs, OUT problem jsonb
) RETURNS SETOF record
-- Its statements take arrays: a custom plan per call (the planner's default while one
-- looks cheaper than the generic plan) re-planned them at every enqueue, which took a
-- one-job enqueue's function twice the time of a generic plan.
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    bad record;
    missing text[];
BEGIN
    -- One job without a dedupe key, into rota's groups table (the usual enqueue): the
    -- rules, the group check and the insert in one statement instead of the three below
    -- (bench/RESULTS.md, section 20). It writes the job only when it breaks no rule and
    -- its group exists, and then writes it as the steps below would. When it writes no
    -- job (a broken rule, an unknown group) it wrote nothing, so the steps below decide
    -- as if it had not run, and say what was wrong. A job with a dedupe key takes the
    -- steps: its statement would not tell a duplicate from a broken rule, and a
    -- duplicate would meet the unique index twice.
    IF s_groups IS NULL AND num_nonnulls(VARIADIC p_dedupe_keys) = 0
       AND greatest(cardinality(p_types), cardinality(p_payloads), cardinality(p_group_ids),
                    cardinality(p_dedupe_keys), cardinality(p_run_afters),
                    cardinality(p_max_attempts), cardinality(p_trace_contexts)) = 1 THEN
        RETURN QUERY
        INSERT INTO {schema}.jobs AS j (type, group_id, payload, dedupe_key, max_attempts,
                                        run_after, created_at, trace_context)
        SELECT t.type, t.group_id, t.payload, t.dedupe_key,
               coalesce(t.max_attempts, (s_max_attempts_by_type ->> t.type)::integer,
                        s_max_attempts),
               coalesce(t.run_after, now() + s_clock_offset),
               now() + s_clock_offset, nullif(t.trace_context, 'null'::jsonb)
        FROM unnest(p_types, p_payloads, p_group_ids, p_dedupe_keys, p_run_afters,
                    p_max_attempts, p_trace_contexts)
             AS t(type, payload, group_id, dedupe_key, run_after, max_attempts,
                  trace_context)
        WHERE {schema}.enqueue_rule(t.type, t.payload, t.group_id, t.dedupe_key,
                                    t.run_after, t.max_attempts, t.trace_context,
                                    s_types, s_max_payload_bytes) IS NULL
          AND (t.group_id IS NULL
               OR EXISTS (SELECT 1 FROM {schema}.groups g WHERE g.group_id = t.group_id))
        ON CONFLICT DO NOTHING
        RETURNING j, NULL::jsonb;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;

    -- The first job that breaks a rule, in the order given, in one pass: each job's
    -- first broken rule, in the order Python checks its arguments, as column:rule. Only
    -- a bad job's message is built, below: building messages here, in the expression
    -- the executor sets up at every call, made a one-job enqueue cost a third more.
    SELECT x.* INTO bad
    FROM (
        SELECT t.*, {schema}.enqueue_rule(t.type, t.payload, t.group_id, t.dedupe_key,
                                         t.run_after, t.max_attempts, t.trace_context,
                                         s_types, s_max_payload_bytes) AS rule
        FROM unnest(p_types, p_payloads, p_group_ids, p_dedupe_keys, p_run_afters,
                    p_max_attempts, p_trace_contexts)
             WITH ORDINALITY AS t(type, payload, group_id, dedupe_key, run_after,
                                  max_attempts, trace_context, n)
        OFFSET 0  -- the rules once a job, not again in the filter
    ) x
    WHERE x.rule IS NOT NULL
    ORDER BY x.n
    LIMIT 1;
    IF FOUND THEN
        -- Python's texts (rota.checks, rota.settings).
        problem := jsonb_build_object(
            'sqlstate', CASE bad.rule WHEN 'type:undeclared' THEN '42704'
                                      WHEN 'payload:large' THEN '54000'
                                      WHEN 'payload:deep' THEN '54000'
                                      ELSE '22023' END,
            'column', split_part(bad.rule, ':', 1),
            'message', CASE WHEN p_name_items THEN 'item ' || bad.n - 1 || ': ' ELSE '' END
            || CASE bad.rule
                WHEN 'type:empty' THEN 'job type must be a non-empty string, got '
                                       || coalesce(quote_literal(bad.type), 'NULL')
                WHEN 'type:long' THEN 'job type is ' || octet_length(bad.type)
                                      || ' bytes long in UTF-8 (' || length(bad.type)
                                      || ' characters); at most 512 bytes are allowed'
                WHEN 'type:undeclared' THEN
                    'unknown job type ' || quote_literal(bad.type) || '; declared types: '
                    || array_to_string(ARRAY(SELECT d FROM unnest(s_types) AS d
                                             ORDER BY d COLLATE "C"), ', ')
                WHEN 'payload:null' THEN
                    'payload must be a JSON value, got NULL (a JSON null is ''null''::jsonb)'
                WHEN 'payload:large' THEN
                    'payload is ' || octet_length(bad.payload::text)
                    || ' bytes, larger than the maximum ' || s_max_payload_bytes
                WHEN 'payload:deep' THEN
                    'payload is nested deeper than 256 levels (or contains itself), more than can be read back'
                WHEN 'group_id:empty' THEN 'group_id must be a non-empty string, got '''''
                WHEN 'group_id:long' THEN 'group_id is ' || octet_length(bad.group_id)
                                          || ' bytes long in UTF-8 (' || length(bad.group_id)
                                          || ' characters); at most 512 bytes are allowed'
                WHEN 'dedupe_key:empty' THEN 'dedupe_key must be a non-empty string, got '''''
                WHEN 'dedupe_key:long' THEN 'dedupe_key is ' || octet_length(bad.dedupe_key)
                                            || ' bytes long in UTF-8 (' || length(bad.dedupe_key)
                                            || ' characters); at most 512 bytes are allowed'
                WHEN 'run_after:range' THEN
                    'run_after='
                    || coalesce(to_char(bad.run_after AT TIME ZONE 'UTC',
                                        CASE WHEN date_part('microseconds', bad.run_after)
                                                  ::bigint % 1000000 = 0
                                             THEN 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'
                                             ELSE 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"' END),
                                bad.run_after::text)
                    || ' is out of range: due times must lie between 0001-01-02 and '
                    || '9999-12-30 (UTC)'
                WHEN 'max_attempts:low' THEN
                    'max_attempts must be an int >= 1, got ' || bad.max_attempts
                WHEN 'trace_context:invalid' THEN
                    'trace_context must be a W3C Trace Context object '
                    || '{{"traceparent": "00-<32 hex trace id>-<16 hex parent id>-<2 hex '
                    || 'flags>"[, "tracestate": "<at most 512 bytes>"]}}, got '
                    || left(bad.trace_context::text, 200)
            END);
        IF p_name_items THEN
            problem := problem || jsonb_build_object('item', bad.n - 1);
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;

    -- The groups the groups relation does not know: then nothing is written.
    IF s_groups IS NULL THEN
        SELECT array_agg(d.group_id ORDER BY d.group_id) INTO missing
        FROM (SELECT DISTINCT x.group_id FROM unnest(p_group_ids) AS x(group_id)
              WHERE x.group_id IS NOT NULL) d
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.groups g WHERE g.group_id = d.group_id);
    ELSE  -- an application's relation, named at run time
        EXECUTE format(
            'SELECT array_agg(d.group_id ORDER BY d.group_id) '
            'FROM (SELECT DISTINCT x.group_id FROM unnest($1) AS x(group_id) '
            '      WHERE x.group_id IS NOT NULL) d '
            'WHERE NOT EXISTS (SELECT 1 FROM %s g WHERE g.group_id = d.group_id)',
            s_groups)
        INTO missing USING p_group_ids;
    END IF;
    IF missing IS NOT NULL THEN
        problem := jsonb_build_object(
            'sqlstate', '23503', 'column', 'group_id', 'message',
            'unknown group' || CASE WHEN cardinality(missing) > 1 THEN 's' ELSE '' END
            || ' ' || array_to_string(ARRAY(SELECT quote_literal(m)
                                            FROM unnest(missing[1:5]) AS m), ', ')
            || CASE WHEN cardinality(missing) > 5 THEN ' …' ELSE '' END
            || ': create it first (a row of the groups relation; queue.upsert_group in '
            || 'Python) or enqueue without a group');
        RETURN NEXT;
        RETURN;
    END IF;

    RETURN QUERY
    INSERT INTO {schema}.jobs AS j (type, group_id, payload, dedupe_key, max_attempts,
                                    run_after, created_at, trace_context)
    SELECT t.type, t.group_id, t.payload, t.dedupe_key,
           coalesce(t.max_attempts, (s_max_attempts_by_type ->> t.type)::integer,
                    s_max_attempts),
           coalesce(t.run_after, now() + s_clock_offset),
           now() + s_clock_offset, nullif(t.trace_context, 'null'::jsonb)
    FROM unnest(p_types, p_payloads, p_group_ids, p_dedupe_keys, p_run_afters,
                p_max_attempts, p_trace_contexts)
         WITH ORDINALITY AS t(type, payload, group_id, dedupe_key, run_after,
                              max_attempts, trace_context, n)
    ORDER BY t.n
    ON CONFLICT DO NOTHING
    RETURNING j, NULL::jsonb;
END
$$;

-- fair_jobs_insert (src/rota/fair/bookkeeping.sql, restated by 017): the usual case in
-- one statement.
CREATE OR REPLACE FUNCTION {schema}.fair_jobs_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    bounded boolean;
BEGIN
    -- The usual case in one statement: lock the rows of the pending jobs' groups (in key
    -- order), then return when every inserted job with a group is pending, due now and
    -- in a group whose row exists and bounds it. A group's jobs are bounded when the row
    -- is at or below (their earliest created_at, their smallest id), which is at or
    -- below each job's (created_at, id); a row that bounds them only taken together
    -- (rare: an id below the row's at its created_at) is left to the steps below, which
    -- test it exactly. Nothing is locked here when a job with a group is inserted
    -- running or done: the steps below take what that needs.
    SELECT count(*) = (SELECT count(DISTINCT (i.type, i.group_id)) FROM inserted i
                       WHERE i.group_id IS NOT NULL)
           AND coalesce(bool_and(l.ok), true)
    INTO bounded
    FROM (SELECT c.due AND (fg.head_lb, fg.head_id) <= (c.head, c.id)
                 AND fg.ready_lb <= c.ready AS ok
          FROM (SELECT i.type, i.group_id, min(i.created_at) AS head, min(i.id) AS id,
                       min(i.run_after) AS ready, bool_and(i.run_after <= now()) AS due
                FROM inserted i
                WHERE i.status = 'pending' AND i.group_id IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM inserted x
                                  WHERE x.status <> 'pending' AND x.group_id IS NOT NULL)
                GROUP BY i.type, i.group_id) c
          JOIN {schema}.fair_groups fg ON fg.type = c.type AND fg.group_id = c.group_id
          ORDER BY fg.type, fg.group_id
          FOR KEY SHARE OF fg) l;
    IF bounded THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(created_at) AS heads, array_agg(id) AS ids,
           array_agg(run_after) AS readies
    INTO r FROM inserted WHERE status = 'pending' AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.ids, r.readies);
    END IF;
    -- Served counts: done rows at or after the edge, and running rows (counted whatever
    -- their lock's age, as 'infinity' passes any edge), each by its cost.
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished,
           array_agg(cost) AS costs
    INTO r FROM inserted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_served(r.types, r.groups, r.finished, r.costs);
    END IF;
    RETURN NULL;
END
$$;
