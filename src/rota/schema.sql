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
    updated_at timestamptz NOT NULL DEFAULT now()
);

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
    -- a run killed only when it has been silent for longer than the platform timeout, so
    -- a live long-running worker's run is never marked.
    heartbeat_at  timestamptz
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
    -- time of the attempt that settled the job; null until it settles.
    result           jsonb,
    started_at       timestamptz
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
-- Done jobs by type and finish time: the claim's exact correction between the served
-- window's edge and its start, and the edge moves (fair_advance).
CREATE INDEX jobs_done_idx ON {schema}.jobs (type, finished_at, group_id)
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
    -- The first job that breaks a rule, in the order given, in one pass: each job's
    -- first broken rule, in the order Python checks its arguments, as column:rule. Only
    -- a bad job's message is built, below: building messages here, in the expression
    -- the executor sets up at every call, made a one-job enqueue cost a third more.
    SELECT x.* INTO bad
    FROM (
        SELECT t.*, CASE
            -- Short names (rota.checks.require_text): at most 512 UTF-8 bytes keeps every
            -- key well inside a btree index row.
            WHEN t.type IS NULL OR t.type = '' THEN 'type:empty'
            WHEN octet_length(t.type) > 512 THEN 'type:long'
            WHEN NOT t.type = ANY (s_types) THEN 'type:undeclared'
            WHEN t.payload IS NULL THEN 'payload:null'
            -- The size of the payload's JSON text as PostgreSQL prints it.
            WHEN octet_length(t.payload::text) > s_max_payload_bytes THEN 'payload:large'
            -- Workers decode payloads recursively (Python's json stops near 1,000
            -- levels): no value may lie more than 256 arrays and objects down.
            WHEN jsonb_path_exists(t.payload, 'strict $.**{{257}}') THEN 'payload:deep'
            WHEN t.group_id = '' THEN 'group_id:empty'
            WHEN octet_length(t.group_id) > 512 THEN 'group_id:long'
            WHEN t.dedupe_key = '' THEN 'dedupe_key:empty'
            WHEN octet_length(t.dedupe_key) > 512 THEN 'dedupe_key:long'
            -- Due times must load back in any session time zone
            -- (rota.checks.require_due_time).
            WHEN NOT t.run_after BETWEEN '0001-01-02 00:00:00+00' AND '9999-12-30 00:00:00+00'
                THEN 'run_after:range'
            WHEN t.max_attempts < 1 THEN 'max_attempts:low'
        END AS rule
        FROM unnest(p_types, p_payloads, p_group_ids, p_dedupe_keys, p_run_afters,
                    p_max_attempts)
             WITH ORDINALITY AS t(type, payload, group_id, dedupe_key, run_after,
                                  max_attempts, n)
        OFFSET 0  -- the CASE once a job, not again in the filter
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
                                    run_after, created_at)
    SELECT t.type, t.group_id, t.payload, t.dedupe_key,
           coalesce(t.max_attempts, (s_max_attempts_by_type ->> t.type)::integer,
                    s_max_attempts),
           coalesce(t.run_after, now() + s_clock_offset),
           now() + s_clock_offset
    FROM unnest(p_types, p_payloads, p_group_ids, p_dedupe_keys, p_run_afters,
                p_max_attempts)
         WITH ORDINALITY AS t(type, payload, group_id, dedupe_key, run_after,
                              max_attempts, n)
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
CREATE FUNCTION {schema}.enqueue(
    type text, payload jsonb, group_id text DEFAULT NULL, dedupe_key text DEFAULT NULL,
    run_after timestamptz DEFAULT NULL, max_attempts integer DEFAULT NULL
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
        {schema}.enqueue_groups_relation(s.groups), s.clock_offset) AS e;
    IF r.problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = r.problem ->> 'sqlstate',
            COLUMN = r.problem ->> 'column', MESSAGE = r.problem ->> 'message';
    END IF;
    RETURN (r.job).id;
END
$$;

-- Enqueue a batch, a JSON array of objects with the arguments of enqueue as keys
-- (type and payload required; run_after an ISO 8601 text with its offset). Returns the
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
                                'max_attempts'] <> '{{}}'::jsonb THEN
                'needs ''type'' and ''payload'', may have ''group_id'', ''dedupe_key'', '
                '''run_after'', ''max_attempts''; unexpected ['
                || (SELECT string_agg(quote_literal(k), ', ' ORDER BY k COLLATE "C")
                    FROM jsonb_object_keys(e.item - ARRAY['type', 'payload', 'group_id',
                                                          'dedupe_key', 'run_after',
                                                          'max_attempts']) AS k)
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
               AS max_attempts
    INTO a
    FROM jsonb_array_elements(enqueue_many.jobs) WITH ORDINALITY AS e(item, n);
    FOR r IN
        SELECT e.job, e.problem
        FROM {schema}.enqueue_jobs(a.types, a.payloads, a.group_ids, a.dedupe_keys,
                                   a.run_afters, a.max_attempts, true,
                                   s.types, s.max_attempts, s.max_attempts_by_type,
                                   s.max_payload_bytes,
                                   {schema}.enqueue_groups_relation(s.groups),
                                   s.clock_offset) AS e
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
REVOKE ALL ON FUNCTION {schema}.enqueue(text, jsonb, text, text, timestamptz, integer)
    FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.enqueue_many(jsonb) FROM PUBLIC;

-- == The fair claim's bookkeeping (docs/fast-claim.md) ===================================
--
-- It lets the claim rank groups without reading the backlog, and is kept exact by
-- triggers on jobs (enqueue, batch enqueue, claim, complete, fail, defer, release, stuck
-- sweep, retry, pruning, and any future statement), so no write path can forget it.
-- Nothing here is a hot spot: no row is updated by every claim or every completion of
-- a group (see each table).
--
-- A group's served count (docs/fast-claim.md#served-counts-without-a-hot-row) is its
-- jobs of the type that are running, or done at or after the type's edge (fair_edge).
-- Running jobs count whatever their lock's age (fair_count_served is given 'infinity'
-- as their finish time, which passes any edge), and the claim subtracts those locked
-- before the window start. A completion (running to done, one shard) nets to no write.

-- Groups of a type that may have pending jobs or a served count, one row each.
-- Head bounds (docs/fast-claim.md#head-bounds-without-a-hot-row): ready_lb and head_lb
-- are lower bounds of the group's pending jobs' run_after and (created_at, id), the
-- latter as (head_lb, head_id), compared as a row like the claim's key (so jobs that
-- share a created_at, as one statement's do, do not tie). Invariant: for every pending
-- job j with a group, a row (j.type, j.group_id) exists with ready_lb <= j.run_after,
-- and (head_lb, head_id) <= (j.created_at, j.id) or head_until <= j.run_after.
-- So while the queue's clock is before head_until, (head_lb, head_id) bounds the
-- (created_at, id) of every claimable job of the group; after it, the claim treats the head as unknown (the
-- group is probed) until fair_fold renews it. head_until lets jobs deferred far ahead
-- (older than the group's ready jobs) stay out of the bound instead of loosening it.
-- Writers that put a job into pending lower the bounds when needed (rare: a new job is
-- newer than its group's head) and otherwise only take FOR KEY SHARE on the row (shared,
-- like a foreign-key check, so concurrent enqueuers of one group never wait for each
-- other). The claim's upkeep raises the bounds afterwards (fair_fold) with FOR UPDATE
-- SKIP LOCKED, which skips a row while any writer that relied on it is still open.
-- served_n is the group's folded served count (fair_served holds the changes not yet
-- folded). A group with no pending job keeps its row (bounds 'infinity': ready_lb
-- 'infinity' means no pending job) while served_n > 0, so the claim reads one row per
-- group.
-- plan and active copy rota's own groups table (kept by the trigger on it, in the same
-- transaction as the change, so a plan change or a pause takes effect at the next claim
-- without touching a job); they let the claim walk each plan's groups through
-- fair_groups_walk_idx instead of reading every group. A queue whose groups relation is
-- an application's view reads plan and active from it at claim time instead.
CREATE TABLE {schema}.fair_groups (
    type       text NOT NULL,
    group_id   text NOT NULL,
    head_lb    timestamptz NOT NULL,
    head_until timestamptz NOT NULL DEFAULT 'infinity',
    ready_lb   timestamptz NOT NULL,
    served_n   integer NOT NULL DEFAULT 0,
    plan       text,
    active     boolean NOT NULL DEFAULT true,
    head_id    bigint NOT NULL DEFAULT 0,  -- with head_lb: a bound of (created_at, id)
    PRIMARY KEY (type, group_id)
) WITH (fillfactor = 70,  -- room for HOT updates
       -- small and rewritten all the time: vacuum it often, not at 20% dead rows
       autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

-- The claim's walk: per type and plan, active groups with pending jobs by served count
-- and head (a lower bound of each group's first job's key within its plan).
CREATE INDEX fair_groups_walk_idx ON {schema}.fair_groups (type, plan, served_n, head_lb, head_id)
    WHERE active AND head_lb < 'infinity';
-- Groups whose head bound has run out (or will): the claim probes them explicitly.
CREATE INDEX fair_groups_expiry_idx ON {schema}.fair_groups (type, head_until)
    WHERE head_until < 'infinity';
-- A groups-table change updates the group's rows of every type (fair_groups_changed).
CREATE INDEX fair_groups_group_idx ON {schema}.fair_groups (group_id);

-- The plans present among a type's groups (NULL, no plan, is always walked). Rows are
-- only ever added (INSERT … ON CONFLICT DO NOTHING takes no lock); a plan no longer
-- used costs the claim one empty index probe. The claim reads its levels here: a loose
-- index scan of fair_groups_walk_idx met the dead entries that folding leaves at the
-- head of every plan's range (2.7 ms at 1,000,000 pending, against 0.05 ms).
CREATE TABLE {schema}.fair_plans (
    type  text NOT NULL,
    plan  text NOT NULL,
    PRIMARY KEY (type, plan)
);

-- Changes to served counts not yet folded into fair_groups.served_n, per type, group and
-- shard: a job entering running adds 1 and one leaving it takes 1 away; done jobs count
-- while finished at or after the edge. The jobs UPDATE trigger writes a statement's net
-- change to its session's shard (backend pid), so concurrent claimers never share a
-- row; deletes and the edge's moves write to shard id % 8. Only the sum over a group's
-- shards means anything. fair_fold moves these rows into served_n
-- every upkeep round, so the table stays small and the claim's sum over it is cheap.
CREATE TABLE {schema}.fair_served (
    type      text NOT NULL,
    group_id  text NOT NULL,
    shard     smallint NOT NULL,
    n         integer NOT NULL,
    PRIMARY KEY (type, group_id, shard)
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000);

-- The checkpoint of the served counts per type (no row: -infinity): served_n and
-- fair_served count the done jobs finished at or after the edge. The claim adds an
-- exact correction over [edge, window start) read from jobs_done_idx, so any window and
-- any clock offset give the exact count; fair_advance keeps the edge near the window
-- start so the correction stays small. Counting writers lock the type's row FOR SHARE
-- (fair_lock_edges) while they decide against the edge; fair_advance locks it FOR
-- UPDATE SKIP LOCKED, so no completion straddles a move of the edge. Row locks, never
-- advisory locks: a role without access to this schema cannot take them.
CREATE TABLE {schema}.fair_edge (
    type      text PRIMARY KEY,
    edge      timestamptz NOT NULL
);

-- Lock the edges of these types (fair_edge rows, FOR SHARE, in type order) for a writer
-- that decides against them: fair_advance takes a row FOR UPDATE SKIP LOCKED, so no
-- completion straddles a move of the edge. A type without a row gets one at
-- '-infinity' first (its first counting writer, once), so there is always a row to lock.
-- Row locks, not advisory locks: only roles granted rota's schema can take them.
CREATE FUNCTION {schema}.fair_lock_edges(p_types text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_types) AS t(type)
               WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_edge e WHERE e.type = t.type))
    THEN
        INSERT INTO {schema}.fair_edge (type, edge)
        SELECT DISTINCT t.type, '-infinity'::timestamptz FROM unnest(p_types) AS t(type)
        ORDER BY 1
        ON CONFLICT (type) DO NOTHING;
    END IF;
    PERFORM 1 FROM {schema}.fair_edge e WHERE e.type = ANY (p_types)
    ORDER BY e.type
    FOR SHARE;
END
$$;

-- Keep fair_groups' copy of plan and active. A group missing from the table ranks as an
-- active group with no owner, so a delete resets the copy to that.
CREATE FUNCTION {schema}.fair_groups_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE {schema}.fair_groups SET plan = NULL, active = true
        WHERE group_id = OLD.group_id AND (plan IS NOT NULL OR NOT active);
    ELSE
        IF TG_OP = 'UPDATE' AND OLD.group_id <> NEW.group_id THEN
            UPDATE {schema}.fair_groups SET plan = NULL, active = true
            WHERE group_id = OLD.group_id;
        END IF;
        UPDATE {schema}.fair_groups SET plan = NEW.plan, active = NEW.active
        WHERE group_id = NEW.group_id
          AND (plan IS DISTINCT FROM NEW.plan OR active IS DISTINCT FROM NEW.active);
        INSERT INTO {schema}.fair_plans (type, plan)
        SELECT DISTINCT f.type, NEW.plan FROM {schema}.fair_groups f
        WHERE f.group_id = NEW.group_id AND NEW.plan IS NOT NULL
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER groups_fair_changed
    AFTER INSERT OR UPDATE OR DELETE ON {schema}.groups
    FOR EACH ROW EXECUTE FUNCTION {schema}.fair_groups_changed();

-- Insert missing fair_groups rows (bounds and served count as given), copying plan and
-- active from rota's groups table under FOR SHARE of those rows, so a concurrent plan
-- change either commits first (and is read here) or waits and then updates these rows.
-- Rows that exist are left alone. The head is the first ready job by (created_at, id).
CREATE FUNCTION {schema}.fair_insert_groups(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[], p_served int[]
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH want0 AS (
        SELECT t.type, t.group_id,
               coalesce((array_agg(t.head ORDER BY t.head, t.id)
                         FILTER (WHERE t.ready <= now()))[1], 'infinity') AS head,
               coalesce((array_agg(t.id ORDER BY t.head, t.id)
                         FILTER (WHERE t.ready <= now()))[1], 0) AS head_id,
               min(t.ready) AS ready,
               coalesce(sum(t.served), 0)::int AS served
        FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies, p_served)
             AS t(type, group_id, head, id, ready, served)
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_groups f
                          WHERE f.type = t.type AND f.group_id = t.group_id)
        GROUP BY t.type, t.group_id
    ),
    -- The head covers the jobs ready now; older jobs due later cut its validity.
    want AS (
        SELECT w.type, w.group_id, w.head, w.head_id, w.ready, w.served,
               coalesce(min(t.ready) FILTER (WHERE t.ready > now()
                                             AND (t.head, t.id) < (w.head, w.head_id)),
                        'infinity') AS until
        FROM want0 w
        JOIN unnest(p_types, p_groups, p_heads, p_ids, p_readies)
             AS t(type, group_id, head, id, ready)
          ON t.type = w.type AND t.group_id = w.group_id
        GROUP BY w.type, w.group_id, w.head, w.head_id, w.ready, w.served
    ),
    g AS (
        SELECT g.group_id, g.plan, g.active FROM {schema}.groups g
        WHERE g.group_id IN (SELECT group_id FROM want)
        ORDER BY g.group_id
        FOR SHARE
    ),
    ins AS (
        INSERT INTO {schema}.fair_groups AS fg (type, group_id, head_lb, head_id, head_until,
                                                ready_lb, served_n, plan, active)
        SELECT w.type, w.group_id, w.head, w.head_id, w.until, w.ready, w.served, g.plan,
               coalesce(g.active, true)
        FROM want w LEFT JOIN g ON g.group_id = w.group_id
        ORDER BY w.type, w.group_id
        ON CONFLICT (type, group_id) DO NOTHING
        RETURNING fg.type, fg.plan
    )
    INSERT INTO {schema}.fair_plans (type, plan)
    SELECT DISTINCT i.type, i.plan FROM ins i WHERE i.plan IS NOT NULL
    ORDER BY 1, 2
    ON CONFLICT DO NOTHING;
END
$$;

-- Record pending jobs (type, group, created_at, id, run_after) in fair_groups, keeping
-- its invariant, one array entry per job as given. Lock first, then lower: fair_fold
-- cannot raise a bound this transaction relies on once the row is locked, and the
-- lowering statement sees its latest value. Called by fair_note_pending, which folds
-- each group's jobs due now into one entry first.
CREATE FUNCTION {schema}.fair_note_pending_each(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    wanted int;
    locked int;
BEGIN
    LOOP
        PERFORM {schema}.fair_insert_groups(p_types, p_groups, p_heads, p_ids, p_readies,
                                            NULL);

        SELECT count(DISTINCT (t.type, t.group_id)) INTO wanted
        FROM unnest(p_types, p_groups) AS t(type, group_id);
        -- FOR KEY SHARE: shared among writers; conflicts only with fair_fold's FOR UPDATE.
        SELECT count(*) INTO locked FROM (
            SELECT 1 FROM {schema}.fair_groups fg
            WHERE (fg.type, fg.group_id) IN (
                SELECT t.type, t.group_id FROM unnest(p_types, p_groups) AS t(type, group_id))
            ORDER BY fg.type, fg.group_id
            FOR KEY SHARE
        ) l;
        EXIT WHEN locked = wanted;  -- else fair_fold deleted a row in between: again
    END LOOP;

    -- Lower where needed: a job ready now lowers (head_lb, head_id); an older job due
    -- later cuts head_until instead. Rows are locked in key order (FOR NO KEY UPDATE,
    -- which does not conflict with other writers' FOR KEY SHARE), so two writers
    -- lowering the same groups cannot deadlock. Rare: new jobs come after their group's
    -- head.
    UPDATE {schema}.fair_groups AS fg
    SET head_lb = a.head, head_id = a.head_id, head_until = a.until, ready_lb = a.ready
    FROM (
        SELECT l.type, l.group_id, n.head, n.head_id, n.ready,
               least(l.head_until, m.until) AS until
        FROM {schema}.fair_groups l
        JOIN (
            -- Per group: the first job ready now, the first due time, and the jobs due
            -- later (the row's bounds are read again below, after the lock; this one
            -- only selects which rows to lock).
            SELECT t.type, t.group_id,
                   (array_agg(t.head ORDER BY t.head, t.id)
                    FILTER (WHERE t.ready <= now()))[1] AS ready_head,
                   (array_agg(t.id ORDER BY t.head, t.id)
                    FILTER (WHERE t.ready <= now()))[1] AS ready_id,
                   min(t.ready) AS min_ready,
                   array_agg(t.head) FILTER (WHERE t.ready > now()) AS due_heads,
                   array_agg(t.id) FILTER (WHERE t.ready > now()) AS due_ids,
                   array_agg(t.ready) FILTER (WHERE t.ready > now()) AS due_readies
            FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
                 AS t(type, group_id, head, id, ready)
            GROUP BY t.type, t.group_id
        ) m0 ON m0.type = l.type AND m0.group_id = l.group_id
        CROSS JOIN LATERAL (
            SELECT CASE WHEN (m0.ready_head, m0.ready_id) < (l.head_lb, l.head_id)
                        THEN m0.ready_head ELSE l.head_lb END AS head,
                   CASE WHEN (m0.ready_head, m0.ready_id) < (l.head_lb, l.head_id)
                        THEN m0.ready_id ELSE l.head_id END AS head_id,
                   least(l.ready_lb, m0.min_ready) AS ready) n
        CROSS JOIN LATERAL (
            SELECT min(d.ready) AS until
            FROM unnest(m0.due_heads, m0.due_ids, m0.due_readies) AS d(head, id, ready)
            WHERE (d.head, d.id) < (n.head, n.head_id)) m
        -- Only rows that change are locked: enqueuers of one group never queue here.
        WHERE (n.head, n.head_id) < (l.head_lb, l.head_id) OR n.ready < l.ready_lb
           OR m.until < l.head_until
        ORDER BY l.type, l.group_id
        FOR NO KEY UPDATE OF l
    ) a
    WHERE fg.type = a.type AND fg.group_id = a.group_id
      AND (fg.head_lb <> a.head OR fg.head_id <> a.head_id OR fg.head_until <> a.until
           OR fg.ready_lb <> a.ready);
END
$$;

-- Record pending jobs (type, group, created_at, id, run_after) in fair_groups: the entry
-- point of the triggers. Only two things about a group's jobs that are due now matter:
-- their first (created_at, id) and their earliest run_after; jobs due later matter one
-- by one (they may cut the head's validity). So each group's due-now jobs become one
-- entry for fair_note_pending_each and the rest pass through (taking one entry per job
-- cost a 1,000-job batch 2.5 ms); and when the rows already bound the new jobs, only
-- the shared locks are taken.
CREATE FUNCTION {schema}.fair_note_pending(
    p_types text[], p_groups text[], p_heads timestamptz[], p_ids bigint[],
    p_readies timestamptz[]
) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    wanted int;
    locked int;
    bounded int;
BEGIN
    -- The usual enqueue: every job due now, into groups whose rows exist and already
    -- bound them ((head_lb, head_id) <= (created_at, id), ready_lb <= run_after). Then
    -- the invariant holds as it is, and the shared locks are all there is to take: one
    -- statement instead of the several below (a one-job enqueue paid 0.15 ms for them).
    IF NOT EXISTS (SELECT 1 FROM unnest(p_readies) AS x(ready) WHERE x.ready > now()) THEN
        WITH c AS (
            SELECT t.type, t.group_id, (array_agg(t.head ORDER BY t.head, t.id))[1] AS head,
                   (array_agg(t.id ORDER BY t.head, t.id))[1] AS id, min(t.ready) AS ready
            FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
                 AS t(type, group_id, head, id, ready)
            GROUP BY t.type, t.group_id
        )
        SELECT (SELECT count(*) FROM c), count(*), count(*) FILTER (WHERE l.ok)
        INTO wanted, locked, bounded
        FROM (SELECT (fg.head_lb, fg.head_id) <= (c.head, c.id)
                     AND fg.ready_lb <= c.ready AS ok
              FROM {schema}.fair_groups fg
              JOIN c ON c.type = fg.type AND c.group_id = fg.group_id
              ORDER BY fg.type, fg.group_id
              FOR KEY SHARE OF fg) l;
        IF wanted = locked AND locked = bounded THEN
            RETURN;
        END IF;
    END IF;
    SELECT array_agg(c.type) AS types, array_agg(c.group_id) AS groups,
           array_agg(c.head) AS heads, array_agg(c.id) AS ids, array_agg(c.ready) AS readies
    INTO r
    FROM (
        SELECT t.type, t.group_id, (array_agg(t.head ORDER BY t.head, t.id))[1] AS head,
               (array_agg(t.id ORDER BY t.head, t.id))[1] AS id, min(t.ready) AS ready
        FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
             AS t(type, group_id, head, id, ready)
        WHERE t.ready <= now()
        GROUP BY t.type, t.group_id
        UNION ALL
        SELECT t.type, t.group_id, t.head, t.id, t.ready
        FROM unnest(p_types, p_groups, p_heads, p_ids, p_readies)
             AS t(type, group_id, head, id, ready)
        WHERE t.ready > now()
    ) c;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending_each(r.types, r.groups, r.heads, r.ids,
                                                r.readies);
    END IF;
END
$$;

-- Add p_delta to fair_served for the served jobs (type, group, id, finished_at) finished
-- at or after their type's edge, under a shared lock of each type's edge row
-- (fair_lock_edges). Running jobs are passed with finished_at 'infinity', so they
-- always count.
CREATE FUNCTION {schema}.fair_count_served(
    p_types text[], p_groups text[], p_ids bigint[], p_finished timestamptz[], p_delta int
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.fair_lock_edges(p_types);
    INSERT INTO {schema}.fair_served AS fs (type, group_id, shard, n)
    SELECT d.type, d.group_id, (d.id % 8)::smallint, p_delta * count(*)::int
    FROM unnest(p_types, p_groups, p_ids, p_finished) AS d(type, group_id, id, finished)
    LEFT JOIN {schema}.fair_edge e ON e.type = d.type
    WHERE d.finished >= coalesce(e.edge, '-infinity')
    GROUP BY d.type, d.group_id, (d.id % 8)::smallint
    ORDER BY 1, 2, 3
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n;
END
$$;

-- The bookkeeping triggers on jobs are statement triggers: one set-based pass over the
-- statement's transition tables, so a batch enqueue, a 1,000-job complete_many or a
-- pruning batch pays once, not per row (a row trigger on UPDATE cost about 50 µs a
-- completed job: a 1,000-job complete_many took 54 ms instead of 15).

-- INSERT: new pending jobs are noted in fair_groups; new running or done ones counted.
-- The usual case, every inserted job pending, due now, in a group whose row already
-- bounds it, takes the shared row locks in one statement over the transition table and
-- stops, without building arrays.
CREATE FUNCTION {schema}.fair_jobs_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    wanted int;
    due int;
    locked int;
    bounded int;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM inserted i
                   WHERE i.status <> 'pending' AND i.group_id IS NOT NULL) THEN
        WITH c AS (
            SELECT i.type, i.group_id,
                   (array_agg(i.created_at ORDER BY i.created_at, i.id))[1] AS head,
                   (array_agg(i.id ORDER BY i.created_at, i.id))[1] AS id,
                   min(i.run_after) AS ready, bool_and(i.run_after <= now()) AS due
            FROM inserted i
            WHERE i.group_id IS NOT NULL
            GROUP BY i.type, i.group_id
        )
        SELECT (SELECT count(*) FROM c), (SELECT count(*) FROM c WHERE c.due),
               count(*), count(*) FILTER (WHERE l.ok)
        INTO wanted, due, locked, bounded
        FROM (SELECT (fg.head_lb, fg.head_id) <= (c.head, c.id)
                     AND fg.ready_lb <= c.ready AS ok
              FROM {schema}.fair_groups fg
              JOIN c ON c.type = fg.type AND c.group_id = fg.group_id
              ORDER BY fg.type, fg.group_id
              FOR KEY SHARE OF fg) l;
        IF wanted = due AND due = locked AND locked = bounded THEN
            RETURN NULL;
        END IF;
    END IF;
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(created_at) AS heads, array_agg(id) AS ids,
           array_agg(run_after) AS readies
    INTO r FROM inserted WHERE status = 'pending' AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.ids, r.readies);
    END IF;
    -- Served counts: done rows at or after the edge, and running rows (counted whatever
    -- their lock's age, as 'infinity' passes any edge).
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(id) AS ids,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished
    INTO r FROM inserted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_served(r.types, r.groups, r.ids, r.finished, 1);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_insert
    AFTER INSERT ON {schema}.jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_insert();

-- UPDATE: each changed row is handled set-based by the kind of change:
--   a row that leaves 'done' or 'running' (or changes its type, group or finish time) is
--   uncounted, a row that enters them (or changes those) is counted;
--   a row that is pending with a group after the update, and entered pending or moved
--   its type, group, created_at or earlier run_after, is noted in fair_groups.
-- Statements that change none of that (a heartbeat) find no row and return.
CREATE FUNCTION {schema}.fair_jobs_update() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    edges text[];
BEGIN
    -- Old and new versions of a row are compared by grouping both transition tables by
    -- id (a sort or a hash, whatever the plan), never by joining them: these statements
    -- have no parameters, so each session plans them once, for the rows of its first
    -- call, and a join planned for a few rows (a nested loop) compared every pair of a
    -- later 1,000-row claim, release or heartbeat (about a second each).
    -- A heartbeat (running rows that stay running in their type and group) changes no
    -- count and notes nothing.
    IF NOT EXISTS (SELECT 1 FROM old_rows o WHERE o.status <> 'running')
       AND NOT EXISTS (SELECT 1 FROM new_rows n WHERE n.status <> 'running')
       AND NOT EXISTS (SELECT 1
                       FROM (SELECT o.id, o.type, o.group_id FROM old_rows o
                             UNION ALL
                             SELECT n.id, n.type, n.group_id FROM new_rows n) x
                       GROUP BY x.id
                       HAVING count(DISTINCT (x.type, x.group_id)) > 1) THEN
        RETURN NULL;
    END IF;
    -- Served counts: a row counts while it is running, or done at or after its type's
    -- edge. Each changed row takes its old version's count away and adds its new one's,
    -- netted per (type, group): a completion (running to done) writes nothing; a claim
    -- adds one per job; a row whose counted state did not change nets to nothing. The
    -- net goes to this session's shard (its backend pid), so concurrent claimers never
    -- wait on each other's bookkeeping rows (with a shard per job id, claims of many
    -- groups queued behind one another); only the sum over a group's shards matters.
    -- Done rows are decided against the edge under the types' edge rows locked FOR
    -- SHARE, as fair_count_served does.
    SELECT array_agg(x.type) INTO edges
    FROM (SELECT o.type FROM old_rows o WHERE o.status = 'done' AND o.group_id IS NOT NULL
          UNION
          SELECT n.type FROM new_rows n WHERE n.status = 'done' AND n.group_id IS NOT NULL) x;
    IF edges IS NOT NULL THEN
        PERFORM {schema}.fair_lock_edges(edges);
    END IF;
    INSERT INTO {schema}.fair_served AS fs (type, group_id, shard, n)
    SELECT v.type, v.group_id, (pg_backend_pid() % 32767)::smallint, sum(v.delta)::int
    FROM (SELECT o.type, o.group_id, o.id, o.status, o.finished_at, -1 AS delta
          FROM old_rows o
          UNION ALL
          SELECT n.type, n.group_id, n.id, n.status, n.finished_at, 1
          FROM new_rows n) v
    LEFT JOIN {schema}.fair_edge e ON e.type = v.type
    WHERE v.group_id IS NOT NULL
      AND (v.status = 'running'
           OR (v.status = 'done' AND v.finished_at >= coalesce(e.edge, '-infinity')))
    GROUP BY 1, 2
    HAVING sum(v.delta) <> 0
    ORDER BY 1, 2, 3
    ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n;
    -- Rows put into pending (fail with retries left, defer, release, retry) are noted in
    -- fair_groups: those that entered pending, or moved their type, group, created_at or
    -- to an earlier run_after.
    IF NOT EXISTS (SELECT 1 FROM new_rows n
                   WHERE n.status = 'pending' AND n.group_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(c.type) AS types, array_agg(c.group_id) AS groups,
           array_agg(c.created_at) AS heads, array_agg(c.id) AS ids,
           array_agg(c.run_after) AS readies
    INTO r
    FROM (SELECT x.id,
                 (array_agg(x.status) FILTER (WHERE x.side = 0))[1] AS was_status,
                 (array_agg(x.type) FILTER (WHERE x.side = 0))[1] AS was_type,
                 (array_agg(x.group_id) FILTER (WHERE x.side = 0))[1] AS was_group,
                 (array_agg(x.created_at) FILTER (WHERE x.side = 0))[1] AS was_created,
                 (array_agg(x.run_after) FILTER (WHERE x.side = 0))[1] AS was_ready,
                 (array_agg(x.type) FILTER (WHERE x.side = 1))[1] AS type,
                 (array_agg(x.group_id) FILTER (WHERE x.side = 1))[1] AS group_id,
                 (array_agg(x.created_at) FILTER (WHERE x.side = 1))[1] AS created_at,
                 (array_agg(x.run_after) FILTER (WHERE x.side = 1))[1] AS run_after,
                 bool_or(x.side = 1) AS pending
          FROM (SELECT 0 AS side, o.id, o.status, o.type, o.group_id, o.created_at,
                       o.run_after
                FROM old_rows o
                UNION ALL
                SELECT 1, n.id, n.status, n.type, n.group_id, n.created_at, n.run_after
                FROM new_rows n
                WHERE n.status = 'pending' AND n.group_id IS NOT NULL) x
          GROUP BY x.id) c
    WHERE c.pending
      AND (c.was_status IS DISTINCT FROM 'pending'
           OR c.was_type IS DISTINCT FROM c.type
           OR c.was_group IS DISTINCT FROM c.group_id
           OR c.was_created IS DISTINCT FROM c.created_at
           OR c.was_ready > c.run_after);
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_note_pending(r.types, r.groups, r.heads, r.ids, r.readies);
    END IF;
    RETURN NULL;
END
$$;

-- Whether a claim candidate is still claimable as last committed (the claim's lock step
-- asks before locking it). VOLATILE, so its query reads a snapshot of its own: a row
-- another claimer took after the claim's snapshot is passed over instead of locked. A
-- lock taken on such a row would not be given back when the row then failed the
-- claim's recheck, and held that worker's completion of it until the claim committed
-- (with several workers, claims and completions queued behind one another for seconds).
CREATE FUNCTION {schema}.fair_still_claimable(p_id bigint, p_now timestamptz,
                                              p_stale_before timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM {schema}.jobs j
        WHERE j.id = p_id AND j.run_after <= p_now
          AND (j.status = 'pending'
               OR (j.status = 'running' AND j.locked_at < p_stale_before
                   AND j.attempts < j.max_attempts)));
END
$$;

CREATE TRIGGER jobs_fair_update
    AFTER UPDATE ON {schema}.jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_update();

-- DELETE (pruning, mostly): deleted done rows at or after the edge, and deleted running
-- rows, leave the served counts. A deleted pending job needs nothing: its group's
-- bounds stay valid lower bounds.
CREATE FUNCTION {schema}.fair_jobs_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT array_agg(type) AS types, array_agg(group_id) AS groups,
           array_agg(id) AS ids,
           array_agg(CASE WHEN status = 'running' THEN 'infinity'::timestamptz
                          ELSE finished_at END) AS finished
    INTO r FROM deleted WHERE status IN ('done', 'running') AND group_id IS NOT NULL;
    IF r.types IS NOT NULL THEN
        PERFORM {schema}.fair_count_served(r.types, r.groups, r.ids, r.finished, -1);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_fair_delete
    AFTER DELETE ON {schema}.jobs
    REFERENCING OLD TABLE AS deleted
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fair_jobs_delete();

-- Move a type's edge to p_target (either direction), recording the change as deltas in
-- fair_served (folded later like any other). Locks the type's edge row FOR UPDATE SKIP
-- LOCKED: when a counting writer holds it (FOR SHARE, fair_lock_edges), it does nothing
-- and returns false (the claim stays exact, its correction is just wider). Each
-- statement of a volatile plpgsql function reads a fresh snapshot, so once the row is
-- locked every done job that any counting writer decided on is visible. Only done jobs
-- can sit between two edges: running jobs are counted as finishing at 'infinity'.
CREATE FUNCTION {schema}.fair_advance(p_type text, p_target timestamptz)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    old_edge timestamptz;
BEGIN
    INSERT INTO {schema}.fair_edge (type, edge) VALUES (p_type, '-infinity')
    ON CONFLICT (type) DO NOTHING;
    SELECT e.edge INTO old_edge FROM {schema}.fair_edge e WHERE e.type = p_type
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_target <> old_edge THEN
        -- Done jobs between the old and the new edge leave (forward) or enter (back).
        INSERT INTO {schema}.fair_served AS fs (type, group_id, shard, n)
        SELECT p_type, j.group_id, 0::smallint,
               (CASE WHEN p_target > old_edge THEN -1 ELSE 1 END) * count(*)::int
        FROM {schema}.jobs j
        WHERE j.type = p_type AND j.status = 'done' AND j.group_id IS NOT NULL
          AND j.finished_at >= least(old_edge, p_target)
          AND j.finished_at < greatest(old_edge, p_target)
        GROUP BY j.group_id
        ORDER BY j.group_id
        ON CONFLICT (type, group_id, shard) DO UPDATE SET n = fs.n + excluded.n;
        UPDATE {schema}.fair_edge SET edge = p_target WHERE type = p_type;
    END IF;
    RETURN true;
END
$$;

-- Fold a type's fair_served deltas into fair_groups.served_n (creating missing rows)
-- and, in the same row update, renew those groups' head bounds and those of up to 100
-- groups whose bound ran out, as of p_now (the queue's clock): (head_lb, head_id) the
-- first job ready at p_now (looked for among the group's 200 oldest; when all of those are
-- deferred, the oldest of all, valid forever), valid until the first job due after
-- p_now. One new row version per group per round, since every version leaves an entry
-- in the walk index. No edge lock is needed: deltas and served_n count against the
-- same edge, and a fold moves them in one transaction. It never waits: rows a writer
-- holds (FOR KEY SHARE or a lowering) and delta rows another fold holds are left for
-- the next one. Returns the number of groups folded.
CREATE FUNCTION {schema}.fair_fold(p_type text, p_now timestamptz) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    gs text[];
    missing text[];
    folded integer;
BEGIN
    SELECT array_agg(DISTINCT f.group_id) INTO gs
    FROM {schema}.fair_served f WHERE f.type = p_type;
    IF gs IS NOT NULL THEN
        SELECT array_agg(x.group_id ORDER BY x.group_id) INTO missing
        FROM unnest(gs) AS x(group_id)
        WHERE NOT EXISTS (SELECT 1 FROM {schema}.fair_groups g
                          WHERE g.type = p_type AND g.group_id = x.group_id);
        IF missing IS NOT NULL THEN
            PERFORM {schema}.fair_insert_groups(
                array_fill(p_type, ARRAY[cardinality(missing)]), missing,
                array_fill('infinity'::timestamptz, ARRAY[cardinality(missing)]),
                array_fill(0::bigint, ARRAY[cardinality(missing)]),
                array_fill('infinity'::timestamptz, ARRAY[cardinality(missing)]), NULL);
        END IF;
    END IF;
    SELECT array_agg(l.group_id) INTO gs FROM (
        SELECT fg.group_id FROM {schema}.fair_groups fg
        JOIN (SELECT x.group_id FROM unnest(gs) AS x(group_id)
              UNION
              SELECT e.group_id FROM (
                  SELECT e.group_id FROM {schema}.fair_groups e
                  WHERE e.type = p_type AND e.head_until <= p_now
                    AND e.head_until < 'infinity'
                  ORDER BY e.head_until LIMIT 100) e) w ON w.group_id = fg.group_id
        WHERE fg.type = p_type
        ORDER BY fg.group_id
        FOR UPDATE OF fg SKIP LOCKED
    ) l;
    IF gs IS NULL THEN
        RETURN 0;
    END IF;
    -- A new statement: its snapshot sees every writer that finished before the locks.
    WITH moved AS (
        DELETE FROM {schema}.fair_served d
        WHERE d.ctid = ANY (ARRAY(
            SELECT f.ctid FROM {schema}.fair_served f
            JOIN unnest(gs) AS x(group_id) ON x.group_id = f.group_id
            WHERE f.type = p_type
            FOR UPDATE OF f SKIP LOCKED))
        RETURNING d.group_id, d.n
    ),
    sums AS (
        SELECT mv.group_id, sum(mv.n)::int AS n FROM moved mv GROUP BY mv.group_id
    ),
    b0 AS (
        SELECT g.group_id,
               coalesce(sm.n, 0) AS n,
               (SELECT min(j.run_after) FROM {schema}.jobs j WHERE j.type = p_type
                  AND j.group_id = g.group_id AND j.status = 'pending') AS ready,
               rh.created_at AS ready_head, rh.id AS ready_id,
               ah.created_at AS any_head, ah.id AS any_id,
               (SELECT min(j.run_after) FROM {schema}.jobs j WHERE j.type = p_type
                  AND j.group_id = g.group_id AND j.status = 'pending'
                  AND j.run_after > p_now) AS next_due
        FROM unnest(gs) AS g(group_id)
        LEFT JOIN sums sm ON sm.group_id = g.group_id
        -- The first ready job among the 200 oldest: read in index order, the scan stops
        -- at it (taking the min over all 200 made a fold of 100 groups of a backlog cost
        -- 8 ms).
        LEFT JOIN LATERAL (
            SELECT o.created_at, o.id FROM (
                SELECT j.created_at, j.id, j.run_after FROM {schema}.jobs j
                WHERE j.type = p_type AND j.group_id = g.group_id AND j.status = 'pending'
                ORDER BY j.created_at, j.id LIMIT 200) o
            WHERE o.run_after <= p_now
            ORDER BY o.created_at, o.id LIMIT 1) rh ON true
        LEFT JOIN LATERAL (
            SELECT j.created_at, j.id FROM {schema}.jobs j
            WHERE j.type = p_type AND j.group_id = g.group_id AND j.status = 'pending'
            ORDER BY j.created_at, j.id LIMIT 1) ah ON true
    )
    UPDATE {schema}.fair_groups fg
    SET served_n = fg.served_n + b.n,
        head_lb = coalesce(b.ready_head, b.any_head, 'infinity'),
        head_id = coalesce(b.ready_id, b.any_id, 0),
        head_until = CASE WHEN b.ready_head IS NULL THEN 'infinity'
                          ELSE coalesce(b.next_due, 'infinity') END,
        ready_lb = coalesce(b.ready, 'infinity')
    FROM b0 b
    WHERE fg.type = p_type AND fg.group_id = b.group_id;
    GET DIAGNOSTICS folded = ROW_COUNT;
    -- Drop rows with nothing left to say (no pending job, no served count).
    DELETE FROM {schema}.fair_groups fg
    USING unnest(gs) AS x(group_id)
    WHERE fg.type = p_type AND fg.group_id = x.group_id
      AND fg.served_n = 0 AND fg.ready_lb = 'infinity';
    RETURN folded;
END
$$;

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

-- == Rate limits (migration 008) ========================================================

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
    SET tat = base + p_units * p_emission,
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
