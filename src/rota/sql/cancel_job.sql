-- admin.cancel_job (`rota jobs cancel ID`): a pending job ends failed with last_error
-- 'cancelled'. It has given up like any failed job, so its give-up hook becomes owed
-- (exactly once: docs/design.md, "Give-up hooks"). Guard: only a pending job; a running
-- one belongs to the run that claimed it.
UPDATE {schema}.jobs
SET status = 'failed',
    finished_at = now() + %(offset)s::interval,
    last_error = 'cancelled',
    give_up_pending = true,
    locked_at = NULL,
    claim_token = NULL
WHERE id = %(id)s AND status = 'pending'
RETURNING *
