-- rota runner schema: quota usage and the runs' sign of life.

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

-- A run's last sign of life (its progress saves and heartbeats). Maintenance marks a
-- run killed only when it has been silent for longer than the platform timeout, so a
-- live long-running worker's run is never marked.
ALTER TABLE {schema}.runs ADD COLUMN heartbeat_at timestamptz;

-- Killed-run sweep: only unfinished runs.
CREATE INDEX runs_unfinished_idx ON {schema}.runs (started_at) WHERE finished_at IS NULL;
