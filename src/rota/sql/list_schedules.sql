-- Every schedule row (`rota schedules`): the app's, and those left by schedules it no
-- longer declares.
SELECT s.name, s.last_tick, s.created_at, s.updated_at
FROM {schema}.schedules s
ORDER BY s.name
