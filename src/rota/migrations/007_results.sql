-- Job results (docs/design.md, "Results"): a handler's return value is stored on the job
-- when it completes, the claim time of the attempt that settled it is kept, and every
-- failed attempt's error (message and traceback, bounded) is kept in job_errors, not
-- only the last one in jobs.last_error. Both columns are null until a job settles, so
-- the claim, which returns whole rows, carries nothing more; the errors live in their
-- own table, which only failing, reading and pruning touch.
ALTER TABLE {schema}.jobs
    ADD COLUMN result jsonb,
    ADD COLUMN started_at timestamptz;

-- One row per failed attempt, pruned with its job (prune_done.sql deletes both in one
-- statement). No foreign key: its trigger would run on every claim and completion.
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
