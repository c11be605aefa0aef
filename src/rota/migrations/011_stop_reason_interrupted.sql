-- A run asked to stop before its budget was spent (its process got SIGINT or SIGTERM,
-- or its caller set the run's stop event) records that as its stop reason,
-- `interrupted`, instead of passing for a run that spent its budget (docs/design.md,
-- "The runner").
ALTER TABLE {schema}.runs
    DROP CONSTRAINT runs_stop_reason_check,
    ADD CONSTRAINT runs_stop_reason_check CHECK (stop_reason IN
        ('no_work', 'time_budget', 'quota_reserve', 'quota_exhausted', 'error',
         'interrupted'));
