-- admin.cancel_job (`rota jobs cancel ID`): a pending job ends failed with last_error
-- 'cancelled'. It has given up like any failed job, so its give-up hook becomes owed
-- (exactly once: docs/design.md, "Give-up hooks"). Guard: only a pending job; a running
-- one belongs to the run that claimed it. A waiter on it is told (docs/design.md,
-- "Results").
WITH cancelled AS (
    UPDATE {schema}.jobs
    SET {failed_now},
        last_error = 'cancelled'
    WHERE id = %(id)s AND status = 'pending'
    RETURNING *
), told AS (
    SELECT pg_notify('rota_settled', %(schema_name)s::text || ':' || c.id)
    FROM cancelled c
    WHERE EXISTS (SELECT 1 FROM {schema}.job_waiters w WHERE w.job_id = c.id)
)
SELECT c.* FROM cancelled c WHERE (SELECT count(*) FROM told) >= 0
