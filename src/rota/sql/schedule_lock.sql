-- Take a schedule's row for this transaction and read its cursor as last committed: a
-- concurrent taker waits here, then sees the tick the first one took
-- (docs/design.md, "Schedules").
SELECT last_tick, created_at
FROM {schema}.schedules
WHERE name = %(name)s
FOR UPDATE
