-- Note jobs deferred for a rate limit's units (the dashboard's "waiting jobs"): one row
-- per job, its latest wait. Waits of this limit that ended over an hour ago go at the
-- same time (by rate_waits_name_until), so the table holds about an hour of waits.
WITH old AS (
    DELETE FROM {schema}.rate_waits
    WHERE name = %(name)s AND until < now() + %(offset)s::interval - interval '1 hour'
      AND job_id <> ALL(%(ids)s::bigint[])
)
INSERT INTO {schema}.rate_waits AS w (job_id, name, key, until)
SELECT x.id, %(name)s, %(key)s, %(until)s
FROM unnest(%(ids)s::bigint[]) AS x(id)
ON CONFLICT (job_id) DO UPDATE
SET name = excluded.name, key = excluded.key, until = excluded.until
