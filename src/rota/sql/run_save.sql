-- Save a run's counters: as progress while it runs (final false: the stop reason and
-- finish time stay as they are), or as its end (final true). The end is written even
-- over a "killed" mark: a run that was only silent, not dead, reports what happened.
UPDATE {schema}.runs
SET jobs_done = %(jobs_done)s,
    jobs_failed = %(jobs_failed)s,
    jobs_deferred = %(jobs_deferred)s,
    quota_units = %(quota_units)s,
    summary = %(summary)s::jsonb,
    heartbeat_at = now() + %(offset)s::interval,
    stop_reason = CASE WHEN %(final)s THEN %(stop_reason)s ELSE stop_reason END,
    error = CASE WHEN %(final)s THEN %(error)s ELSE error END,
    finished_at = CASE WHEN %(final)s THEN now() + %(offset)s::interval ELSE finished_at END
WHERE id = %(id)s
RETURNING finished_at
