-- Move a schedule's cursor to the tick just taken, in the transaction that enqueues its
-- job(s). Never backwards (the guard repeats what the lock already ensures).
UPDATE {schema}.schedules
SET last_tick = %(tick)s, updated_at = now() + %(offset)s::interval
WHERE name = %(name)s
  AND (last_tick IS NULL OR last_tick < %(tick)s)
