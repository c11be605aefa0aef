-- A run's row is written when it starts, so a run that is killed stays visibly
-- unfinished (finished_at NULL) until maintenance marks it.
INSERT INTO {schema}.runs (id, trigger, started_at, heartbeat_at)
VALUES (%(id)s, %(trigger)s, now() + %(offset)s::interval, now() + %(offset)s::interval)
RETURNING started_at
