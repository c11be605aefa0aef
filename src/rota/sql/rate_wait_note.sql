-- Note jobs deferred for a rate limit's units (the dashboard's "waiting jobs"): one row
-- per job, its latest wait.
INSERT INTO {schema}.rate_waits AS w (job_id, name, key, until)
SELECT * FROM unnest(%(ids)s::bigint[], %(names)s::text[], %(keys)s::text[],
                     %(untils)s::timestamptz[])
ON CONFLICT (job_id) DO UPDATE
SET name = excluded.name, key = excluded.key, until = excluded.until
