-- rota's current schema, for fresh installs (`rota schema`, and rota.db.migrate on a
-- schema with no recorded migration). The schema placeholder is replaced by the quoted
-- schema name (and doubled braces by single ones). It states the end state of every file
-- in migrations/ applied in order, which upgrade existing schemas; a schema change is a
-- new migration plus the same change here, and tests/test_migrations.py replays the
-- migrations and compares the catalogs (docs/operations.md#migrations-and-upgrades).

-- == Groups, runs, jobs ==================================================================

CREATE TABLE {schema}.groups (
    group_id   text PRIMARY KEY,
    owner_id   text,                              -- whose plan and allowances apply
    plan       text,                              -- null: no owner, ranks as the middle plan
    active     boolean NOT NULL DEFAULT true,     -- paused groups' jobs are not claimable
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Caps the group's running jobs, every type (null: no cap; docs/design.md, "Caps").
    max_running integer CONSTRAINT groups_max_running_check CHECK (max_running > 0)
);
-- The caps set: the smallest, for the uncapped claim's check for any capped group and the
-- capped claim's gate on the groups at their cap.
CREATE INDEX groups_capped_idx ON {schema}.groups (max_running)
    WHERE max_running IS NOT NULL;
-- An owner's groups on a plan: what a capped owner's running jobs are counted over
-- (fair_cap_lock's groups; docs/design.md, "Caps").
CREATE INDEX groups_owner_idx ON {schema}.groups (owner_id, plan) WHERE owner_id IS NOT NULL;

CREATE TABLE {schema}.runs (
    id            uuid PRIMARY KEY,
    trigger       text NOT NULL CHECK (trigger IN ('cron', 'cli', 'worker', 'manual')),
    stop_reason   text CHECK (stop_reason IN
                    ('no_work', 'time_budget', 'quota_reserve', 'quota_exhausted', 'error',
                     'interrupted')),
    jobs_done     integer NOT NULL DEFAULT 0,
    jobs_failed   integer NOT NULL DEFAULT 0,
    jobs_deferred integer NOT NULL DEFAULT 0,
    quota_units   integer NOT NULL DEFAULT 0,
    summary       jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    error         text,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    -- The run's last sign of life (its progress saves and heartbeats). Maintenance marks
    -- a run killed only when it has been silent for longer than the stale window, so a
    -- live long-running worker's run is never marked.
    heartbeat_at  timestamptz,
    -- The process that ran it, host:pid (one for all the runs of one worker).
    worker        text
);
CREATE INDEX runs_started_idx ON {schema}.runs (started_at DESC);
-- Killed-run sweep: only unfinished runs.
CREATE INDEX runs_unfinished_idx ON {schema}.runs (started_at) WHERE finished_at IS NULL;

-- A plain INSERT of a type and a payload would skip the rules and the defaults of
-- enqueue ("Enqueue" below): the columns only enqueue_jobs fills default to this,
-- which refuses it, naming the function, instead of a bare NOT NULL error. A statement
-- that gives every column (a migration, a test fixture) works.
CREATE FUNCTION {schema}.jobs_insert_refused(p_column anyelement) RETURNS anyelement
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = '0A000',
        MESSAGE = 'jobs are enqueued with {schema}.enqueue(type, payload, ...) or '
                  '{schema}.enqueue_many(jobs), which apply the queue''s checks and '
                  'defaults; a plain INSERT INTO {schema}.jobs must give max_attempts, '
                  'run_after and created_at itself',
        HINT = 'SELECT {schema}.enqueue(''my_type'', ''{{"key": "value"}}'');';
END
$$;

CREATE TABLE {schema}.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type             text NOT NULL CHECK (type <> ''),
    group_id         text,
    payload          jsonb NOT NULL,
    dedupe_key       text,
    status           text NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     integer NOT NULL CHECK (max_attempts > 0)
                       DEFAULT {schema}.jobs_insert_refused(NULL::integer),
    deferrals        integer NOT NULL DEFAULT 0,
    run_after        timestamptz NOT NULL
                       DEFAULT {schema}.jobs_insert_refused(NULL::timestamptz),
    locked_at        timestamptz,
    claim_token      uuid,                         -- fences every transition after a claim
    last_error       text,
    -- The run that claimed the job, for inspection. Not a foreign key to runs: the check
    -- made every claimed row look its run up (2.8 of the 18 ms of a 1,000-job claim) and
    -- checked nothing, since runs are never deleted and a runner only claims under the
    -- run it has just written.
    run_id           uuid,
    created_at       timestamptz NOT NULL
                       DEFAULT {schema}.jobs_insert_refused(NULL::timestamptz),
    finished_at      timestamptz,
    give_up_pending  boolean NOT NULL DEFAULT false, -- failed, give-up hook not yet run
    -- Results (docs/design.md, "Results"): the handler's return value, and the claim
    -- time of the latest attempt (set by the claim); null until it is first claimed.
    result           jsonb,
    started_at       timestamptz,
    -- The W3C Trace Context of the span that enqueued the job ({{"traceparent": …,
    -- "tracestate": …}}), or null: its handler's span continues that trace
    -- (docs/operations.md, "Traces").
    trace_context    jsonb,
    -- What the job counts in its group's served count (docs/design.md, "Cost"): while it
    -- runs, its type's expected cost (set by the claim, fair_costs); once done, what its
    -- handler charged (1 when it charged nothing). Pending and failed jobs count nothing.
    cost             numeric NOT NULL DEFAULT 1
                       CONSTRAINT jobs_cost_check CHECK (cost > 0 AND cost <= 1000000000),
    -- The slot a running job holds (docs/design.md, "Caps"): the plan and owner ('o:' ||
    -- owner_id, or 'g:' || group_id) whose cap it counts against, as the capped claim
    -- that took it saw them; null when the claim that took it had no caps. A hint the
    -- capped claim checks against the job's group (cap_prelude_on.sql), never trusts.
    slot_plan        text,
    slot_owner       text
);

-- Every enqueue, claim and completion inserts an entry into each index whose predicate
-- the new row version matches, so jobs has only partial indexes that some statement
-- reads, and no index over every row (`rota jobs` walks the primary key newest first).

-- One open job per dedupe key: done and failed rows, and jobs without a key (NULL never
-- conflicts), are outside the index. Enqueue's ON CONFLICT DO NOTHING names no target,
-- so it arbitrates on this index.
CREATE UNIQUE INDEX jobs_open_dedupe_uq ON {schema}.jobs (dedupe_key)
    WHERE dedupe_key IS NOT NULL AND status IN ('pending', 'running');
-- The claim's probe: a group's first pending jobs by age. With run_after carried in the
-- index, the ready test is made on the index entry and the probe is an index-only scan
-- on all-visible pages (at 1,000,000 pending jobs the heap no longer fits in
-- shared_buffers, and each probed job cost a heap page read).
CREATE INDEX jobs_pending_idx ON {schema}.jobs (type, group_id, created_at, id)
    INCLUDE (run_after) WHERE status = 'pending';
-- Head bound upkeep: a group's pending jobs by due time (fair_fold).
CREATE INDEX jobs_pending_ready_idx ON {schema}.jobs (type, group_id, run_after)
    WHERE status = 'pending';
-- Running jobs by type and lock time: the claim subtracts those locked before the served
-- window starts; the stuck-job sweep looks for stale locks.
CREATE INDEX jobs_running_idx ON {schema}.jobs (type, locked_at)
    WHERE status = 'running';
-- Stale reclaim: only running jobs that still have attempts left; stuck jobs (attempts
-- used up, waiting for fail_stuck_jobs) never enter this index, so they cost nothing.
CREATE INDEX jobs_reclaimable_idx ON {schema}.jobs (type, locked_at)
    WHERE status = 'running' AND attempts < max_attempts;
-- Running jobs by group, every type: what a capped owner has running (fair_cap_lock,
-- and the claim's owners at their cap, cap_prelude_on.sql; docs/design.md, "Caps").
CREATE INDEX jobs_running_group_idx ON {schema}.jobs (group_id, locked_at)
    WHERE status = 'running';
-- Running jobs of capped plans by plan: the capped claim's owners at their cap
-- (cap_prelude_on.sql), as many entries as jobs of capped plans run at once.
CREATE INDEX jobs_running_slot_idx ON {schema}.jobs (slot_plan, locked_at)
    WHERE status = 'running' AND slot_plan IS NOT NULL;
-- Done jobs by type and finish time: the claim's exact correction between the served
-- window's edge and its start, and the edge moves (fair_advance), which count each
-- job's cost (docs/design.md, "Cost"), read from the index like the rest.
CREATE INDEX jobs_done_idx ON {schema}.jobs (type, finished_at, group_id) INCLUDE (cost)
    WHERE status = 'done';
-- Failed jobs, for inspection (`rota jobs failed`).
CREATE INDEX jobs_failed_idx ON {schema}.jobs (type, id) WHERE status = 'failed';
-- Give-up hooks still owed.
CREATE INDEX jobs_give_up_idx ON {schema}.jobs (type, id) WHERE give_up_pending;

-- == Quotas ==============================================================================

-- Units spent per quota, scope and period. scope_key is '' for a shared quota (the
-- third-party API's) and the owner id for a per-owner allowance; period_start is the
-- local midnight (in the quota's time zone) the period began at, as an instant.
-- Spending is one INSERT … ON CONFLICT DO UPDATE … WHERE units + n <= limit on this key,
-- so concurrent spenders serialize on the row and never exceed the limit.
CREATE TABLE {schema}.quota_usage (
    quota        text NOT NULL CHECK (quota <> ''),
    scope_key    text NOT NULL DEFAULT '',
    period_start timestamptz NOT NULL,
    units        bigint NOT NULL CHECK (units >= 0),
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (quota, scope_key, period_start)
);

-- == Wake-ups ============================================================================

-- Wake sleeping workers when jobs are enqueued: `rota worker` LISTENs on a channel named
-- exactly like the schema (TG_TABLE_SCHEMA here, the same name there, so the two cannot
-- drift). Statement-level, so a batch enqueue sends one notification, and only when the
-- statement inserted rows (ON CONFLICT DO NOTHING may insert none). PostgreSQL delivers
-- notifications at commit and folds identical ones of one transaction into one, so a
-- job enqueued in a rolled-back transaction wakes nobody.
CREATE FUNCTION {schema}.notify_jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM inserted) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, 'insert');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_inserted
    AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.notify_jobs_inserted();

-- == Enqueue (docs/enqueue-from-sql.md) ================================================

-- enqueue_jobs holds the rules of enqueue once; Python's Queue.enqueue and enqueue_many
-- call it with their own settings, the SQL entry points enqueue and enqueue_many with
-- the settings published in enqueue_settings (docs/design.md, "Enqueue").

-- The settings the SQL entry points apply: those of the Python queue that last published
-- them (Queue.migrate, rota migrate --app, Queue.publish_settings). One row.
CREATE TABLE {schema}.enqueue_settings (
    one                  boolean PRIMARY KEY DEFAULT true CHECK (one),
    types                text[],                       -- the declared types; null: any
    max_attempts         integer NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
    max_attempts_by_type jsonb NOT NULL DEFAULT '{{}}'::jsonb,  -- {{"type": attempts}}
    max_payload_bytes    integer NOT NULL DEFAULT 1048576 CHECK (max_payload_bytes > 0),
    groups               text,                 -- the groups relation; null: this schema's
    clock_offset         interval NOT NULL DEFAULT '0',
    published_at         timestamptz
);
INSERT INTO {schema}.enqueue_settings DEFAULT VALUES;

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

-- The rules of enqueue, once (docs/design.md, "Enqueue"), for a batch given as parallel
-- arrays, with the queue's settings as arguments (s_*): each job checked, then its group
-- against the groups relation (s_groups; null for rota's groups table), then every job
-- inserted in the order given with the defaults (max_attempts by type, then the
-- queue's; run_after and created_at on the queue's clock, now() + s_clock_offset). A
-- duplicate of an open job (or of an earlier one in the batch) is skipped by the partial
-- unique index on dedupe_key, so it returns no row. Bad input raises nothing: nothing is
-- written and one row comes back whose problem ({{sqlstate, column, message[, item]}})
-- says what was wrong, so a Python caller's transaction stays usable; the SQL entry
-- points raise it. Otherwise it returns the jobs created; the statement triggers on jobs
-- keep the claim's bookkeeping and NOTIFY the workers.
CREATE FUNCTION {schema}.enqueue_jobs(
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

-- The groups relation the SQL entry points check groups against: null for rota's own
-- table, else the published name, which must be schema-qualified: under their fixed
-- search_path an unqualified name would be looked up in pg_temp too, where a caller could
-- create a table of its own. (Publishing records the name qualified once it exists.)
CREATE FUNCTION {schema}.enqueue_groups_relation(p_name text) RETURNS regclass
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_name IS NOT NULL AND cardinality(parse_ident(p_name)) < 2 THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'the groups relation ' || quote_literal(p_name) || ' in '
                      || '{schema}.enqueue_settings is not schema-qualified: create it, '
                      || 'then publish the queue''s settings again (rota migrate --app)';
    END IF;
    RETURN p_name::regclass;
END
$$;

-- The SQL entry points: SECURITY DEFINER, so a role granted EXECUTE on them (and USAGE on
-- the schema) enqueues without any privilege on the tables; the search_path is fixed so
-- that nothing of the caller's can stand in for a built-in. They run as their owner, the
-- role that migrated the schema.

-- Enqueue one job; returns its id, or null when an open job has the same dedupe key.
-- trace_context: the W3C Trace Context of the caller's span, stored with the job so its
-- handler's span continues the caller's trace (docs/operations.md, "Traces").
CREATE FUNCTION {schema}.enqueue(
    type text, payload jsonb, group_id text DEFAULT NULL, dedupe_key text DEFAULT NULL,
    run_after timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL,
    trace_context jsonb DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s {schema}.enqueue_settings;
    r record;
BEGIN
    SELECT * INTO s FROM {schema}.enqueue_settings;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = '{schema}.enqueue_settings has no row: run rota migrate';
    END IF;
    SELECT e.job, e.problem INTO r
    FROM {schema}.enqueue_jobs(
        ARRAY[enqueue.type], ARRAY[enqueue.payload], ARRAY[enqueue.group_id],
        ARRAY[enqueue.dedupe_key], ARRAY[enqueue.run_after], ARRAY[enqueue.max_attempts],
        false, s.types, s.max_attempts, s.max_attempts_by_type, s.max_payload_bytes,
        {schema}.enqueue_groups_relation(s.groups), s.clock_offset,
        ARRAY[enqueue.trace_context]) AS e;
    IF r.problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.problem ->> 'sqlstate',
            COLUMN = r.problem ->> 'column', MESSAGE = r.problem ->> 'message';
    END IF;
    RETURN (r.job).id;
END
$$;

-- Enqueue a batch, a JSON array of objects with the arguments of enqueue as keys
-- (type and payload required; run_after an ISO 8601 text with its offset; trace_context
-- as for enqueue). Returns the
-- ids of the jobs created, in the order given; duplicates of open jobs, or of earlier
-- items, return none. A bad item or unknown group raises, naming it; nothing is written.
CREATE FUNCTION {schema}.enqueue_many(jobs jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    s {schema}.enqueue_settings;
    bad record;
    a record;
    r record;
BEGIN
    IF jsonb_typeof(enqueue_many.jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'jobs',
            MESSAGE = 'jobs must be a JSON array of objects (one per job), got '
                      || coalesce(jsonb_typeof(enqueue_many.jobs), 'NULL');
    END IF;
    -- The first item that is not a job object with fields of the right JSON types (their
    -- values are enqueue_jobs' to check), in one pass.
    SELECT x.n - 1 AS i, x.message INTO bad
    FROM (
        SELECT e.n, CASE
            WHEN jsonb_typeof(e.item) <> 'object' THEN
                'expected an object, got ' || jsonb_typeof(e.item)
            WHEN e.item - ARRAY['type', 'payload', 'group_id', 'dedupe_key', 'run_after',
                                'max_attempts', 'trace_context'] <> '{{}}'::jsonb THEN
                'needs ''type'' and ''payload'', may have ''group_id'', ''dedupe_key'', '
                '''run_after'', ''max_attempts'', ''trace_context''; unexpected ['
                || (SELECT string_agg(quote_literal(k), ', ' ORDER BY k COLLATE "C")
                    FROM jsonb_object_keys(e.item - ARRAY['type', 'payload', 'group_id',
                                                          'dedupe_key', 'run_after',
                                                          'max_attempts',
                                                          'trace_context']) AS k)
                || ']'
            WHEN NOT e.item ? 'type' OR NOT e.item ? 'payload' THEN
                'needs ''type'' and ''payload'''
            WHEN jsonb_typeof(e.item -> 'type') <> 'string' THEN
                'job type must be a non-empty string, got ' || (e.item -> 'type')::text
            WHEN jsonb_typeof(e.item -> 'group_id') NOT IN ('string', 'null') THEN
                'group_id must be a non-empty string, got ' || (e.item -> 'group_id')::text
            WHEN jsonb_typeof(e.item -> 'dedupe_key') NOT IN ('string', 'null') THEN
                'dedupe_key must be a non-empty string, got '
                || (e.item -> 'dedupe_key')::text
            -- An instant needs its offset: a time without one is refused, never guessed.
            WHEN jsonb_typeof(e.item -> 'run_after') <> 'null'
                 AND coalesce(e.item ->> 'run_after', '') !~
                     '^\d{{4}}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d{{1,6}})?)?(Z|z|[+-]\d\d(:?\d\d)?)$'
            THEN
                'run_after must be an ISO 8601 time with its UTC offset '
                '(2030-01-01T09:00:00Z), got ' || (e.item -> 'run_after')::text
            -- (A CASE, so that only a number is read as one.)
            WHEN CASE jsonb_typeof(e.item -> 'max_attempts')
                     WHEN 'null' THEN false
                     WHEN 'number' THEN (e.item ->> 'max_attempts')::numeric
                                        <> trunc((e.item ->> 'max_attempts')::numeric)
                                        OR NOT (e.item ->> 'max_attempts')::numeric
                                               BETWEEN -2147483648 AND 2147483647
                     ELSE true END THEN
                'max_attempts must be an int >= 1, got ' || (e.item -> 'max_attempts')::text
        END AS message
        FROM jsonb_array_elements(enqueue_many.jobs) WITH ORDINALITY AS e(item, n)
    ) x
    WHERE x.message IS NOT NULL
    ORDER BY x.n
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = 'jobs',
            MESSAGE = 'item ' || bad.i || ': ' || bad.message;
    END IF;
    SELECT * INTO s FROM {schema}.enqueue_settings;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = '{schema}.enqueue_settings has no row: run rota migrate';
    END IF;
    SELECT array_agg(e.item ->> 'type' ORDER BY e.n) AS types,
           array_agg(e.item -> 'payload' ORDER BY e.n) AS payloads,
           array_agg(e.item ->> 'group_id' ORDER BY e.n) AS group_ids,
           array_agg(e.item ->> 'dedupe_key' ORDER BY e.n) AS dedupe_keys,
           array_agg((e.item ->> 'run_after')::timestamptz ORDER BY e.n) AS run_afters,
           array_agg((e.item ->> 'max_attempts')::numeric::integer ORDER BY e.n)
               AS max_attempts,
           array_agg(e.item -> 'trace_context' ORDER BY e.n) AS trace_contexts
    INTO a
    FROM jsonb_array_elements(enqueue_many.jobs) WITH ORDINALITY AS e(item, n);
    FOR r IN
        SELECT e.job, e.problem
        FROM {schema}.enqueue_jobs(a.types, a.payloads, a.group_ids, a.dedupe_keys,
                                   a.run_afters, a.max_attempts, true,
                                   s.types, s.max_attempts, s.max_attempts_by_type,
                                   s.max_payload_bytes,
                                   {schema}.enqueue_groups_relation(s.groups),
                                   s.clock_offset, a.trace_contexts) AS e
    LOOP
        IF r.problem IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = r.problem ->> 'sqlstate',
                COLUMN = r.problem ->> 'column', MESSAGE = r.problem ->> 'message';
        END IF;
        RETURN NEXT (r.job).id;
    END LOOP;
END
$$;

-- Functions are executable by PUBLIC by default: these two run as their owner, so only
-- the roles granted EXECUTE may call them (docs/enqueue-from-sql.md, "Privileges").
REVOKE ALL ON FUNCTION {schema}.enqueue(text, jsonb, text, text, timestamptz, integer,
                                       jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.enqueue_many(jsonb) FROM PUBLIC;

-- == The fair claim's bookkeeping ======================================================
-- Its tables, functions and triggers are kept in the fair claim's package, with the
-- claim that reads them (docs/fast-claim.md); rota.db.schema_text puts the file here.
-- @include fair/bookkeeping.sql

-- Periodic schedules (docs/design.md, "Schedules"): one row per schedule name, holding
-- the last tick taken. A tick is enqueued in the transaction that moves last_tick past
-- it, under this row's lock, so each tick is taken once across every worker on every
-- host, also after its job has finished (the dedupe index covers open jobs only).
CREATE TABLE {schema}.schedules (
    name       text PRIMARY KEY,
    last_tick  timestamptz,          -- the latest tick taken (enqueued or skipped); null: none yet
    created_at timestamptz NOT NULL, -- first seen (queue clock): earlier ticks are not owed
    updated_at timestamptz NOT NULL
);

-- Every failed attempt's error (docs/design.md, "Results"), pruned with its job
-- (prune_done.sql deletes both in one statement). No foreign key: its trigger would run
-- on every claim and completion.
CREATE TABLE {schema}.job_errors (
    job_id     bigint NOT NULL,
    id         bigint GENERATED ALWAYS AS IDENTITY,
    attempt    integer NOT NULL,          -- jobs.attempts when it failed (1 = first)
    run_id     uuid,                      -- the run (worker) that ran the attempt
    started_at timestamptz,               -- when the attempt was claimed (queue clock)
    failed_at  timestamptz NOT NULL,      -- queue clock
    error      text NOT NULL,             -- "Type: message", bounded
    error_type text,                      -- the exception's class, module.qualname
    traceback  text,                      -- bounded (head and tail); null without one
    PRIMARY KEY (job_id, id)
);

-- Who is waiting for a job (docs/design.md, "Results"): Queue.wait adds a row while it
-- waits, and the statements that settle a job notify rota_settled only for jobs with
-- one, so completions pay for a notification (a lock every notifying commit in the
-- database takes in turn) only when someone is listening.
CREATE TABLE {schema}.job_waiters (
    job_id     bigint NOT NULL,
    waiter     uuid NOT NULL,
    since      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, waiter)
);

-- == Rate limits (docs/design.md, "Rates") ==========================================

-- Rate limits shared by every worker (docs/design.md, "Rates"): one bucket row per
-- (limit, key), spent by rate_take under the row's lock, so every process on every host
-- sees one bucket. A generic cell rate algorithm (a token bucket kept as one instant):
-- `tat` is the instant the bucket is full again; a unit refills every `emission`
-- (per / limit, rounded up to the microsecond); `burst` units can be taken at once from a
-- full bucket. A tat further ahead than burst * emission is a bucket below zero: units
-- spent after the fact, or a backoff, that later takers wait out.
CREATE TABLE {schema}.rate_buckets (
    name         text NOT NULL CHECK (name <> ''),
    key          text NOT NULL DEFAULT '',           -- '' for an unkeyed limit
    tat          timestamptz NOT NULL,               -- full again at this instant
    limit_units  bigint NOT NULL CHECK (limit_units > 0),
    per          interval NOT NULL,
    burst        bigint NOT NULL CHECK (burst > 0),
    emission     interval NOT NULL,
    window_start timestamptz NOT NULL,               -- the fixed window of `per` now counted
    window_units bigint NOT NULL DEFAULT 0,          -- units taken in it (for display)
    prev_units   bigint NOT NULL DEFAULT 0,          -- units taken in the window before
    taken        bigint NOT NULL DEFAULT 0,          -- units ever taken
    refused      bigint NOT NULL DEFAULT 0,          -- takes ever refused (deferred jobs)
    backoff_until timestamptz,                       -- the last backoff asked for
    updated_at   timestamptz NOT NULL,
    PRIMARY KEY (name, key)
);

-- Jobs deferred because a rate limit had no units for them, and until when: the
-- dashboard's "waiting jobs". A row whose job has moved on (claimed again, deferred for
-- another reason, deleted) no longer matches its job's run_after and is not counted;
-- noting a wait deletes the limit's waits that ended over an hour ago.
CREATE TABLE {schema}.rate_waits (
    job_id bigint PRIMARY KEY,
    name   text NOT NULL,
    key    text NOT NULL,
    until  timestamptz NOT NULL
);
CREATE INDEX rate_waits_name_until ON {schema}.rate_waits (name, until);

-- Take units of a rate limit (docs/design.md, "Rates"), at clock_timestamp() read after
-- the bucket's row lock is held (so time spent waiting for the lock never makes a taker
-- look earlier than it is), plus the queue's clock offset.
--   p_max_wait NULL: after the fact: always granted now, the bucket may go below zero.
--   otherwise: granted when the units are there within p_max_wait (the caller waits
--   until `at`, a reservation no later taker can have); else refused, nothing changes
--   but the refusal count, and `at` is the moment the units will be there.
-- Returns granted, at, and wait_s: seconds from the take until `at` (>= 0).
-- Computed times saturate (docs/design.md, "Time"): a debt of units spent after the fact
-- ends at the latest due time, 9999-12-30, at the most, so a huge take neither overflows
-- the interval arithmetic nor leaves `tat` where no reader can load it.
CREATE FUNCTION {schema}.rate_take(
    p_name text, p_key text, p_units bigint, p_limit bigint, p_per interval,
    p_burst bigint, p_emission interval, p_max_wait interval, p_offset interval
) RETURNS TABLE (granted boolean, at timestamptz, wait_s float8)
LANGUAGE plpgsql AS $$
DECLARE
    b record;
    t timestamptz;
    base timestamptz;
    free_at timestamptz;
    w_start timestamptz;
    latest_due constant timestamptz := '9999-12-30 00:00:00+00';
BEGIN
    -- A bucket's state is soft: losing the last few milliseconds of takes in a server
    -- crash forgets units, it never invents them. Not waiting for the WAL flush keeps
    -- the row lock short, which is what bounds takes per second on one key.
    PERFORM set_config('synchronous_commit', 'off', true);
    INSERT INTO {schema}.rate_buckets AS r
        (name, key, tat, limit_units, per, burst, emission, window_start, updated_at)
    VALUES (p_name, p_key, '-infinity', p_limit, p_per, p_burst, p_emission,
            '-infinity', clock_timestamp() + p_offset)
    ON CONFLICT (name, key) DO NOTHING;
    SELECT * INTO b FROM {schema}.rate_buckets r
    WHERE r.name = p_name AND r.key = p_key FOR UPDATE;
    t := clock_timestamp() + p_offset;
    base := greatest(b.tat, t);
    IF p_max_wait IS NULL THEN
        free_at := t;
    ELSE
        -- The units are there once the bucket holds p_units: burst - p_units emissions
        -- before it is full again.
        free_at := greatest(base - (p_burst - p_units) * p_emission, t);
        IF free_at > t + p_max_wait THEN
            UPDATE {schema}.rate_buckets r
            SET refused = r.refused + 1, limit_units = p_limit, per = p_per,
                burst = p_burst, emission = p_emission, updated_at = t
            WHERE r.name = p_name AND r.key = p_key;
            RETURN QUERY SELECT false, free_at,
                extract(epoch FROM free_at - t)::float8;
            RETURN;
        END IF;
    END IF;
    -- Units count in the fixed window of `per` (aligned to the epoch) their take falls in.
    w_start := to_timestamp(floor(extract(epoch FROM free_at)
                                  / extract(epoch FROM p_per))
                            * extract(epoch FROM p_per));
    w_start := greatest(w_start, b.window_start);  -- a clock moved back counts as now
    UPDATE {schema}.rate_buckets r
    SET tat = CASE WHEN p_units * extract(epoch FROM p_emission)::numeric
                        < extract(epoch FROM latest_due - base)::numeric
                   THEN base + p_units * p_emission ELSE latest_due END,
        limit_units = p_limit, per = p_per, burst = p_burst, emission = p_emission,
        prev_units = CASE WHEN w_start = r.window_start THEN r.prev_units
                          WHEN w_start = r.window_start + p_per THEN r.window_units
                          ELSE 0 END,
        window_units = CASE WHEN w_start = r.window_start THEN r.window_units + p_units
                            ELSE p_units END,
        window_start = greatest(w_start, r.window_start),
        taken = r.taken + p_units,
        updated_at = t
    WHERE r.name = p_name AND r.key = p_key;
    RETURN QUERY SELECT true, free_at, extract(epoch FROM free_at - t)::float8;
END
$$;
