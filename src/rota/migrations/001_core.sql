-- rota core schema. The schema placeholder is replaced by the quoted schema name.

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
                    ('no_work', 'time_budget', 'quota_reserve', 'quota_exhausted', 'error')),
    jobs_done     integer NOT NULL DEFAULT 0,
    jobs_failed   integer NOT NULL DEFAULT 0,
    jobs_deferred integer NOT NULL DEFAULT 0,
    quota_units   integer NOT NULL DEFAULT 0,
    summary       jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    error         text,
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz
);
CREATE INDEX runs_started_idx ON {schema}.runs (started_at DESC);

CREATE TABLE {schema}.jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    type             text NOT NULL CHECK (type <> ''),
    group_id         text,
    payload          jsonb NOT NULL,
    dedupe_key       text,
    status           text NOT NULL DEFAULT 'pending'
                       CHECK (status IN ('pending', 'running', 'done', 'failed')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     integer NOT NULL CHECK (max_attempts > 0),
    deferrals        integer NOT NULL DEFAULT 0,
    run_after        timestamptz NOT NULL,
    locked_at        timestamptz,
    claim_token      uuid,                         -- fences every transition after a claim
    last_error       text,
    run_id           uuid REFERENCES {schema}.runs (id) ON DELETE SET NULL,
    created_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    give_up_pending  boolean NOT NULL DEFAULT false -- failed, give-up hook not yet run
);

-- One open job per dedupe key: done and failed rows are outside the index.
CREATE UNIQUE INDEX jobs_open_dedupe_uq ON {schema}.jobs (dedupe_key)
    WHERE status IN ('pending', 'running');

-- Claim: pending jobs of a type, by group and age.
CREATE INDEX jobs_pending_idx ON {schema}.jobs (type, group_id, created_at, id)
    WHERE status = 'pending';
-- Claim (stale reclaim) and the served window both read running jobs by type.
CREATE INDEX jobs_running_idx ON {schema}.jobs (type, locked_at)
    WHERE status = 'running';
-- Served window: done jobs by type, group and finish time.
CREATE INDEX jobs_done_idx ON {schema}.jobs (type, finished_at, group_id)
    WHERE status = 'done';
-- Give-up hooks still owed.
CREATE INDEX jobs_give_up_idx ON {schema}.jobs (type, id) WHERE give_up_pending;
-- Inspection and pruning.
CREATE INDEX jobs_status_type_idx ON {schema}.jobs (status, type);
