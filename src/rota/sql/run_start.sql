-- A run's row is written when it starts, so a run that is killed stays visibly
-- unfinished (finished_at NULL) until maintenance marks it.
-- `worker` names the process (host:pid).
INSERT INTO {schema}.runs (id, trigger, started_at, heartbeat_at, worker)
VALUES (%(id)s, %(trigger)s, now() + %(offset)s::interval, now() + %(offset)s::interval,
        %(worker)s)
RETURNING started_at
