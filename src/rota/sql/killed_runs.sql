-- Runs silent (no progress save or heartbeat) for longer than the platform timeout
-- cannot still be alive: mark them ended by error "killed". Four stop reasons are
-- healthy; a killed run is an incident and must say so. It ended, as far as anyone can
-- tell, at its last sign of life, not when this sweep noticed.
UPDATE {schema}.runs
SET stop_reason = 'error',
    error = 'killed',
    finished_at = coalesce(heartbeat_at, started_at)
WHERE finished_at IS NULL
  AND coalesce(heartbeat_at, started_at)
      < now() + %(offset)s::interval - %(platform_timeout)s::interval
RETURNING id
