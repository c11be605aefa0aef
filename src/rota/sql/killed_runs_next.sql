-- Seconds until the next unfinished run has been silent for the stale window (when
-- killed_runs.sql will mark it), or NULL when no run is unfinished: the worker wakes
-- then, so a killed run is marked as soon as it can be known (docs/design.md,
-- "Maintenance"). Unfinished runs are few, read through runs_unfinished_idx.
SELECT extract(epoch FROM min(coalesce(heartbeat_at, started_at))
                          + %(stale_after)s::interval
                          - (now() + %(offset)s::interval))::float8
FROM {schema}.runs
WHERE finished_at IS NULL
