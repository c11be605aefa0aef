-- Bounded table: delete one batch of finished runs started before the runs' retention
-- cutoff (docs/design.md, "Maintenance"). Unfinished runs are left for the killed-runs
-- sweep to close first. runs_started_idx gives the oldest first; batches keep each
-- transaction short.
WITH old AS (
    SELECT id
    FROM {schema}.runs
    WHERE started_at < now() + %(offset)s::interval - %(retention)s::interval
      AND finished_at IS NOT NULL
    ORDER BY started_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.runs AS r
USING old
WHERE r.id = old.id
