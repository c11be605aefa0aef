-- Runs silent (no progress save or heartbeat) for longer than the stale window cannot
-- still be alive: a live run saves at least every heartbeat_every, which a pipeline keeps
-- within half its platform timeout, itself shorter than the stale window; and the run's
-- jobs are being reclaimed by then (docs/design.md, "Stale locks", "Maintenance"). Mark
-- them ended by error "killed". Four stop reasons are healthy; a killed run is an
-- incident and must say so. It ended, as far as anyone can tell, at its last sign of
-- life, not when this sweep noticed.
UPDATE {schema}.runs
SET stop_reason = 'error',
    error = 'killed',
    finished_at = coalesce(heartbeat_at, started_at)
WHERE finished_at IS NULL
  AND coalesce(heartbeat_at, started_at)
      < now() + %(offset)s::interval - %(stale_after)s::interval
RETURNING id
